"""Request and response bodies: the REST API's (`api`), the operator's (`admin`) and the
OpenAI-compatible routes' (`openai`)."""
