"""The landing zone at the location the settings give: a directory, or an S3 prefix.

The S3 backend (`ml_platform.ingestion.s3_landing`) is imported only for an S3 location, for
the reason `ml_platform.platform.locations` gives.
"""

from typing import TYPE_CHECKING

from ml_platform.ingestion.landing import LandingStore, LandingZone
from ml_platform.platform.locations import s3_resource
from ml_platform.platform.settings import Location, Settings

if TYPE_CHECKING:
    from dagster_aws.s3 import S3Resource


def landing_store(
    location: Location, settings: Settings, s3: "S3Resource | None" = None
) -> LandingStore:
    """The landing zone at a location: a directory, or an S3 prefix.

    The S3 prefix is reached through `s3` (default: the settings' `S3Resource`).
    """
    if location.kind == "s3":
        from ml_platform.ingestion.s3_landing import S3LandingZone

        return S3LandingZone(url=location.config(), s3=s3 or s3_resource(settings))
    return LandingZone(base_dir=location.config())
