"""The lake on S3: an S3 prefix reached through `dagster_aws.s3.S3Resource`.

Imported only where a location is on S3 (`locations.lake_storage`, `zones.landing_store`), so
a process whose lake and landing zone are directories never imports dagster_aws.
"""

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Any

import dagster as dg
from botocore.exceptions import ClientError
from dagster_aws.s3 import S3Resource
from pydantic import Field, PrivateAttr

from ml_platform.platform.settings import parse_s3_url
from ml_platform.platform.storage import LakeStorage, is_missing_key


class S3Prefix(dg.ConfigurableResource):
    """An S3 prefix and the `S3Resource` whose client reaches it: what S3 lake and landing share.

    Credentials come from the boto3 chain the `S3Resource` uses, never from this configuration.
    """

    url: str = Field(description="s3://bucket/prefix")
    s3: S3Resource

    _client: Any = PrivateAttr(default=None)

    @property
    def bucket(self) -> str:
        """The bucket of the prefix."""
        return parse_s3_url(self.url)[0]

    @property
    def prefix(self) -> str:
        """The key prefix: empty or ending with '/'."""
        return parse_s3_url(self.url)[1]

    def client(self) -> Any:
        """The S3 client of the `S3Resource`, created once per resource instance."""
        if self._client is None:
            self._client = self.s3.get_client()
        return self._client


class S3Storage(S3Prefix, LakeStorage):
    """Lake storage below an S3 prefix (production; any S3-compatible endpoint).

    A PUT replaces an object whole, so readers see the old version or the new one, as with
    the local directory.
    """

    def uri(self, key: str) -> str:
        """The s3:// URI of the object."""
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def exists(self, key: str) -> bool:
        """Whether an object is stored under `key` (one listing request).

        Not HEAD: without an unconditional s3:ListBucket, which the least-privilege policy
        (deploy/iam-policy.json) does not grant, AWS answers HEAD of a missing key with 403.
        """
        full = self.prefix + key
        with self.naming("looking up", key):
            response = self.client().list_objects_v2(Bucket=self.bucket, Prefix=full, MaxKeys=1)
        return any(item["Key"] == full for item in response.get("Contents", []))

    def write_bytes(self, key: str, data: bytes) -> None:
        """One PUT: S3 makes the new object visible whole or not at all."""
        with self.naming("writing", key):
            self.client().put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)

    def _get_object(self, key: str) -> Any:
        """The object's GET response; FileNotFoundError naming its URI when there is none."""
        with self.naming("reading", key):
            try:
                return self.client().get_object(Bucket=self.bucket, Key=self.prefix + key)
            except ClientError as exc:
                if is_missing_key(exc):
                    raise FileNotFoundError(f"no object at {self.uri(key)}") from exc
                raise

    def read_bytes(self, key: str) -> bytes:
        """The object's bytes; FileNotFoundError naming its URI when there is none."""
        response = self._get_object(key)
        with self.naming("reading", key):
            return response["Body"].read()

    def write_with(self, key: str, write: Callable[[IO[bytes]], object]) -> int:
        """Spool what `write` writes to a local temporary file, then PUT it from there.

        One PUT still replaces the object whole; the spool keeps the bytes on disk, not in
        memory, while the SDK streams them.
        """
        with self.naming("writing", key), tempfile.TemporaryFile() as spool:
            write(spool)
            size = spool.tell()
            spool.seek(0)
            self.client().put_object(Bucket=self.bucket, Key=self.prefix + key, Body=spool)
        return size

    @contextlib.contextmanager
    def open_read(self, key: str) -> Iterator[IO[bytes]]:
        """The object downloaded to a local temporary file (a parquet reader needs to seek)."""
        response = self._get_object(key)
        with self.naming("reading", key), tempfile.TemporaryFile() as spool:
            with contextlib.closing(response["Body"]) as body:
                shutil.copyfileobj(body, spool, 1 << 20)
            spool.seek(0)
            yield spool

    def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error in S3."""
        with self.naming("deleting", key):
            self.client().delete_object(Bucket=self.bucket, Key=self.prefix + key)

    def list_keys(self, prefix: str) -> list[str]:
        """Keys of the objects below a folder, sorted, listed page by page."""
        # The empty prefix is the whole lake (`check_key`), as a directory lists it: not "/".
        folder = self.prefix + (prefix.strip("/") + "/" if prefix.strip("/") else "")
        keys: list[str] = []
        paginator = self.client().get_paginator("list_objects_v2")
        with self.naming("listing", prefix):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=folder):
                for item in page.get("Contents", []):
                    key = item["Key"][len(self.prefix) :]
                    if not key.rsplit("/", 1)[-1].startswith(".") and not key.endswith("/"):
                        keys.append(key)
        return sorted(keys)
