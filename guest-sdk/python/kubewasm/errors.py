"""The error a reconcile raises when it cannot decide what to do (the WIT `error` record).

Raise :class:`RetryableError` for a failure that may go away by itself (a read that was
refused or timed out): the host backs off and calls ``reconcile`` again for the same object.
Raise :class:`PermanentError` for one that retrying with the same input cannot fix (an invalid
spec): it is recorded in the controller's status and waits for the object, or the controller,
to change.

Any other exception escaping ``reconcile`` is a bug in the guest: it is reported like a Rust
guest's panic (retryable, with its type and message; the traceback goes to stderr, which the
host logs).
"""


class Error(Exception):
    """Why a reconcile failed, and whether the host should retry it."""

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        #: What went wrong, for people reading the controller's status.
        self.message = str(message)
        #: Whether trying again later may succeed.
        self.retryable = bool(retryable)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Error):
            return NotImplemented
        return (self.message, self.retryable) == (other.message, other.retryable)

    def __hash__(self) -> int:
        return hash((self.message, self.retryable))

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        kind = "RetryableError" if self.retryable else "PermanentError"
        return f"{kind}({self.message!r})"


class RetryableError(Error):
    """A failure that may go away by itself: the host backs off and retries."""

    def __init__(self, message: str):
        super().__init__(message, retryable=True)


class PermanentError(Error):
    """A failure that retrying with the same input cannot fix."""

    def __init__(self, message: str):
        super().__init__(message, retryable=False)


def from_host(message: str, retryable: bool) -> Error:
    """The host's ``error`` record as the subclass that says its kind, so that a guest can
    ``except RetryableError``."""
    return RetryableError(message) if retryable else PermanentError(message)


def invalid_json(err: Exception) -> PermanentError:
    """A document that is not JSON will not get better by retrying."""
    return PermanentError(f"invalid JSON: {err}")
