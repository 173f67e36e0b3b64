"""The lake's storage at the location the settings give: a directory, or an S3 prefix.

The S3 backend (`ml_platform.platform.s3`) is imported only for an S3 location: dagster_aws's
imports cost about 1.5 s of CPU in every process that loads the code location (each run, the
code server, each `ml-platform` command), which a lake and landing zone in directories never use.
"""

from typing import TYPE_CHECKING

from ml_platform.platform.settings import Location, Settings
from ml_platform.platform.storage import LakeStorage, LocalStorage

if TYPE_CHECKING:
    from dagster_aws.s3 import S3Resource


def s3_resource(settings: Settings) -> "S3Resource":
    """The one `S3Resource` of the code location: endpoint and region from the settings."""
    from dagster_aws.s3 import S3Resource

    return S3Resource(**settings.s3_config)


def lake_storage(
    location: Location, settings: Settings, s3: "S3Resource | None" = None
) -> LakeStorage:
    """The lake's storage at a location: a directory, or an S3 prefix.

    The S3 prefix is reached through `s3` (default: the settings' `S3Resource`). Values from
    the environment stay `EnvVar`s.
    """
    if location.kind == "s3":
        from ml_platform.platform.s3 import S3Storage

        return S3Storage(url=location.config(), s3=s3 or s3_resource(settings))
    return LocalStorage(base_dir=location.config())
