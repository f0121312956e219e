"""Every error moerag raises on purpose, each with a stable code.

The engine and the services raise these; `app.core.errors.STATUS` is the one table that maps a
code to an HTTP status (the engine knows no HTTP), and the CLI prints `code: message`.
"""


class MoeragError(Exception):
    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InputError(MoeragError, ValueError):
    """The document cannot be ingested as given (the caller's fault, not ours)."""

    code = "invalid_document"


class UnsupportedType(InputError):
    code = "unsupported_type"


class EmptyDocument(InputError):
    code = "empty_document"


class DocumentTooLarge(InputError):
    code = "document_too_large"


class DegenerateDocument(InputError):
    """Text that would make the same chunk over and over (one word repeated): refused before any work."""

    code = "degenerate_document"


class UndecodableDocument(InputError):
    code = "undecodable_document"


class CorruptDocument(InputError):
    code = "corrupt_document"


class InvalidSetting(InputError):
    """A setting names something that does not exist here (a generator, a model)."""

    code = "invalid_setting"


class NotFound(MoeragError, LookupError):
    """A document, chunk, cluster, expert, job, question or router version id that does not exist."""

    code = "not_found"


class Conflict(MoeragError):
    """The change collides with what is there (a name taken)."""

    code = "conflict"


class OutOfScope(MoeragError):
    """A scoped token's write that would put a document outside its scope (the message names the
    token's own scope, nothing of the store)."""

    code = "out_of_scope"


class NotConfigured(MoeragError):
    """A well-formed setting whose backend this server is not configured for (openai without
    MOERAG_OPENAI_BASE_URL): the request is right, the server's state refuses it."""

    code = "not_configured"


class SourceUnavailable(MoeragError):
    """A source to sync (a git repository, a web site) could not be read: its message says why."""

    code = "source_unavailable"


class TooManyJobs(MoeragError):
    """The job queue is full (MOERAG_MAX_QUEUED_JOBS): retry once some have run."""

    code = "too_many_jobs"


class NotTrainable(MoeragError, ValueError):
    """The router cannot be trained yet (no expert owns a cluster)."""

    code = "not_trainable"


class UnknownExperts(MoeragError, LookupError):
    """Labelled questions name experts that do not exist (nothing was added)."""

    code = "unknown_expert"


class IndexMoved(MoeragError):
    """The clustering changed while chunks were being placed (another process reclustered);
    the write was rolled back whole and may be retried once this replica has followed."""

    code = "index_moved"


class InvalidRequest(MoeragError):
    """The request cannot be done as asked (a field that contradicts another, a path or URL refused)."""

    code = "invalid_request"


class ExpertNotFound(NotFound):
    code = "expert_not_found"


class ModelNotFound(NotFound):
    """An OpenAI-compatible model id that names no expert."""

    code = "model_not_found"


class GeneratorUnavailable(MoeragError):
    """The generator an answer needs cannot be reached or set up."""

    code = "generator_unavailable"


class GeneratorFailed(MoeragError):
    """The generator was reached but failed while answering."""

    code = "generator_failed"


class RateLimited(MoeragError):
    """A client asks faster than its rate allows; `retry_after_s`: when it may ask again."""

    code = "rate_limited"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
