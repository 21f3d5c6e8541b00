"""The one error root of DeepPod.

Every error a user can see is a :class:`DeepPodError` with a stable ``code`` and a
message that says what to do. The API maps them to HTTP with one handler; the SDK
turns an API error body back into the same class, so CLI, SDK and server agree.
"""

from __future__ import annotations


class DeepPodError(Exception):
    """Root of all DeepPod errors. ``code`` is stable and machine-readable."""

    code = "error"
    status = 500

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message}

    def __str__(self) -> str:
        return self.message


class InvalidRequest(DeepPodError):
    code = "invalid_request"
    status = 422


class Unauthenticated(DeepPodError):
    code = "unauthenticated"
    status = 401


class Forbidden(DeepPodError):
    code = "forbidden"
    status = 403


class NotFound(DeepPodError):
    code = "not_found"
    status = 404


class Conflict(DeepPodError):
    code = "conflict"
    status = 409


class TooLarge(DeepPodError):
    code = "too_large"
    status = 413


class UnsupportedMediaType(DeepPodError):
    code = "unsupported_media_type"
    status = 415


class Unavailable(DeepPodError):
    code = "unavailable"
    status = 503


class Busy(Unavailable):
    """The server has no room for the request now (every database connection it may use is
    busy): nothing was done; retry after ``Retry-After`` seconds (the CLI and SDK do)."""

    code = "busy"
    retry_after = 1


class DatabaseMisuse(DeepPodError):
    """A bug: a read-only session (a GET request's, store/db.read_only) tried to write."""

    code = "internal"
    status = 500


class ExecutorError(DeepPodError):
    code = "executor_error"
    status = 500


class LimitsUnavailable(ExecutorError):
    """This host's control groups cannot be used here (not mounted, not writable): executor/cgroups.py."""


class EnvBuildFailed(ExecutorError):
    """A job's own Python environment could not be built; the message is the installer's own
    error lines and a hint (envs/build.py)."""


class NotLeader(DeepPodError):
    """This server does not lead a failover control plane (any more): it must not decide or
    act on jobs (cluster/leader.py)."""

    code = "not_leader"
    status = 503


class NodeLost(ExecutorError):
    """A node left the cluster while a job started or ran on it: the job goes back to the queue."""

    def __init__(self, nodes: list[str], message: str):
        super().__init__(message)
        self.nodes = list(nodes)


class BadInput(InvalidRequest):
    """A predict request's input cannot be fed to the model; the message says what was expected."""

    code = "bad_input"


class NoReplica(Unavailable):
    """No replica of a deployment can take the request (code ``unavailable``, HTTP 503)."""


class UpstreamError(Unavailable):
    """A replica could not be reached or dropped the request; the router tries another."""


class MoveFailed(DeepPodError):
    """A dataset version could not be moved between storage tiers."""

    code = "move_failed"


_BY_STATUS = {cls.status: cls for cls in (InvalidRequest, Unauthenticated, Forbidden, NotFound, Conflict, TooLarge,
                                          UnsupportedMediaType, Unavailable)}


def from_response(status: int, body: object) -> DeepPodError:
    """Rebuild the error an API response carries (used by the SDK)."""
    code, message = "error", f"HTTP {status}"
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = str(body["error"].get("code", code))
        message = str(body["error"].get("message", message))
    elif isinstance(body, str) and body:
        message = body
    cls = _BY_STATUS.get(status, DeepPodError)
    return cls(message, code=code, status=status)


class FormErrors(InvalidRequest):
    """A web console form refused: field name -> message (``_form`` for the form as a whole),
    with the status the API gives the same refusal."""

    def __init__(self, errors: dict[str, str], status: int = 422):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()), status=status)
        self.errors = errors


class Rerender(DeepPodError):
    """A refused console form answered with its page again (``response``); the request's
    transaction is undone, so nothing it began is kept."""

    def __init__(self, response):
        super().__init__("the form was refused", status=getattr(response, "status_code", 422))
        self.response = response


# S3's own error codes and their HTTP statuses (s3/app.py answers them in S3's XML)
S3_STATUS = {
    "AccessDenied": 403, "AuthorizationHeaderMalformed": 400, "AuthorizationQueryParametersError": 400,
    "BadDigest": 400, "EntityTooLarge": 400, "EntityTooSmall": 400, "IncompleteBody": 400, "InternalError": 500,
    "InvalidAccessKeyId": 403, "InvalidArgument": 400, "InvalidBucketName": 400, "InvalidDigest": 400,
    "InvalidPart": 400, "InvalidPartOrder": 400, "MetadataTooLarge": 400, "InvalidRange": 416, "InvalidRequest": 400,
             "MalformedXML": 400,
    "MethodNotAllowed": 405, "MissingContentLength": 411, "NoSuchBucket": 404, "NoSuchKey": 404,
    "NoSuchUpload": 404, "NotImplemented": 501, "PreconditionFailed": 412, "RequestTimeTooSkewed": 403,
    "SignatureDoesNotMatch": 403, "XAmzContentSHA256Mismatch": 400, "NotModified": 304,
}


class S3Error(DeepPodError):
    """An S3 request refused: ``code`` is S3's own (``NoSuchKey``, ``SignatureDoesNotMatch``, ...)."""

    def __init__(self, code: str, message: str):
        super().__init__(message, code=code, status=S3_STATUS.get(code, 400))


class ClientGone(DeepPodError):
    """An S3 client disconnected mid-body (s3/app.py catches it where the body is read: nobody
    is left to answer, and what was written of the upload is removed)."""

    code = "client_gone"

    def __init__(self, message: str = "the client disconnected before the whole body came"):
        super().__init__(message)


class StepAbandoned(DeepPodError):
    """A lone worker gave up the step under way for a new world (``runtime.Resizer.interruptible``):
    drop the step and call ``check()``."""

    code = "step_abandoned"
