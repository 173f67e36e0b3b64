"""Day files landed on S3: the production landing zone, behind `LandingStore`.

Imported only where the landing zone is on S3 (`zones.landing_store`), so a process whose
landing zone is a directory never imports dagster_aws.
"""

import contextlib
from collections.abc import Iterator
from typing import IO, Any

from botocore.exceptions import ClientError

from ml_platform.ingestion.landing import LandedObject, LandingStore, unsafe_name_reason
from ml_platform.platform.s3 import S3Prefix
from ml_platform.platform.storage import is_missing_key


def denied(exc: ClientError) -> bool:
    """Whether S3 refused the request (403), which AWS also answers for a key it will not list."""
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return error.get("Code") in ("AccessDenied", "403", "Forbidden") or status == 403


class S3LandingZone(S3Prefix, LandingStore):
    """An S3 prefix where day files land (production; any S3-compatible endpoint).

    The client is the shared `S3Resource`'s; credentials come from the boto3 chain
    (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile or a task role), never from this
    configuration.
    """

    def modified_slack_seconds(self) -> float:
        """Five minutes: LastModified is when an upload began, on the storage's clock."""
        return 300.0

    def path_for(self, file_name: str) -> str:
        """The s3:// URI of a landed file of this name."""
        return f"s3://{self.bucket}/{self.prefix}{file_name}"

    def find(self, file_name: str) -> LandedObject | None:
        """One listing request: the object's LastModified and ETag, or None if absent.

        Not HEAD: without an unconditional s3:ListBucket, which the least-privilege policy
        (deploy/iam-policy.json) does not grant, AWS answers HEAD of a missing key with 403,
        and a day not landed yet would read as a permissions error (as in `S3Storage.exists`).
        """
        key = self.prefix + file_name
        response = self.client().list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1)
        for item in response.get("Contents", []):
            if item["Key"] == key:
                return LandedObject(
                    name=file_name,
                    modified=item["LastModified"].timestamp(),
                    version=str(item["ETag"]).strip('"'),
                    refused=unsafe_name_reason(file_name),
                )
        return None

    @contextlib.contextmanager
    def open_file(self, file_name: str, partition: str) -> Iterator[IO[bytes]]:
        """The landed object's body, streamed as it is read; MissingLandingFileError if gone.

        A name with `.`/`..` segments or an absolute-looking one is refused before any request.
        """
        reason = unsafe_name_reason(file_name)
        if reason is not None:
            raise self.refused(file_name, partition, reason)
        try:
            response = self.client().get_object(Bucket=self.bucket, Key=self.prefix + file_name)
        except ClientError as exc:
            if is_missing_key(exc) or (denied(exc) and self.absent(file_name)):
                raise self.missing(file_name, partition) from exc
            stop = self.not_allowed(file_name, partition, exc)
            if stop is not None:
                raise stop from exc
            raise
        body = response["Body"]
        try:
            yield body
        finally:
            # Releases the connection to the pool even when the reader stopped early.
            body.close()

    def absent(self, file_name: str) -> bool:
        """Whether a listing says no object of this name is there (False if it is refused too).

        Under the least-privilege policy AWS answers GET of a missing key with 403, as it does
        a refused one; the listing, which the policy allows, tells a day not landed yet.
        """
        try:
            return self.find(file_name) is None
        except ClientError:
            return False

    def list_page(self, after: str | None, limit: int) -> tuple[list[LandedObject], str | None]:
        """One ListObjectsV2 call: up to `limit` objects whose keys sort after `after`."""
        request: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix, "MaxKeys": limit}
        if after is not None:
            request["StartAfter"] = self.prefix + after
        response = self.client().list_objects_v2(**request)
        objects = [
            LandedObject(
                name=item["Key"][len(self.prefix) :],
                modified=item["LastModified"].timestamp(),
                version=str(item["ETag"]).strip('"'),
                refused=unsafe_name_reason(item["Key"][len(self.prefix) :]),
            )
            for item in response.get("Contents", [])
            # Names below the prefix only; "folders" created by consoles are empty keys.
            if item["Key"] != self.prefix and not item["Key"].endswith("/")
        ]
        keys = [item["Key"] for item in response.get("Contents", [])]
        more = bool(response.get("IsTruncated")) and bool(keys)
        return objects, (keys[-1][len(self.prefix) :] if more else None)
