"""Links into docs/runbook.md, the one place that says what to do about each alert and check."""

from ml_platform.platform.failures import RUNBOOK_PATH

# The checks with a section "## Check <name>" of their own; a test keeps this list, the checks
# of the definitions and the runbook's headings in step. The quality gate's checks are named
# here, not imported from validation/, because every stage imports this module.
CHECK_SECTIONS = frozenset(
    {
        "raw_schema",
        "schema_change",
        "gx_schema",
        "gx_completeness",
        "gx_validity",
        "gx_uniqueness",
        "gx_volume",
        "gx_partition_day",
        "gx_history",
        "delivery_accepted",
        "features_drift",
        "loss_plateau",
        "finite_weights",
        "cpu_utilisation",
        "promotion_verdict",
        "rejection_streak",
        "champion_decay",
        "drift_episode",
    }
)


def check_anchor(check: str) -> str:
    """The runbook section of a check; checks without their own share `warning-check`."""
    return f"check-{check}" if check in CHECK_SECTIONS else "warning-check"


def check_description(check: str, text: str) -> str:
    """A check's description with the runbook section to read when it fails."""
    return f"{text} If it fails: {RUNBOOK_PATH}#{check_anchor(check)}"
