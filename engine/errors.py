"""Errors the engine raises for bad input; `app` turns them into 4xx responses."""


class InputError(ValueError):
    """The document cannot be ingested as given (the caller's fault, not ours)."""

    status = 422
    code = "invalid_document"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnsupportedType(InputError):
    status = 415
    code = "unsupported_type"


class EmptyDocument(InputError):
    code = "empty_document"


class DocumentTooLarge(InputError):
    status = 413
    code = "document_too_large"


class UndecodableDocument(InputError):
    code = "undecodable_document"


class CorruptDocument(InputError):
    code = "corrupt_document"


class InvalidSetting(InputError):
    """A setting names something that does not exist here (a generator, a model)."""

    code = "invalid_setting"
