"""The errors that end a run the same way on every rank, so that every entry point can
turn them into one line and an exit status: bad input (exit 2) before anything runs,
ranks that disagree at start (2), replicas that drifted apart (3)."""


class ConfigError(ValueError):
    """A configuration value, key or file that cannot be used; the message says why."""


class StartupMismatch(RuntimeError):
    """Ranks disagree on something that must be equal before training starts."""


class ReplicaDivergence(RuntimeError):
    """Ranks hold different parameters or optimizer state: the comparison is void."""


class AccountingError(RuntimeError):
    """What was sent does not add up to what was used plus what was dropped (a design's
    ledger, :mod:`mpirl.kit.ledger`), or a message says it is not what its receiver
    counted."""
