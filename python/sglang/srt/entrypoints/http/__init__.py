"""The HTTP API as FastAPI routers, each built from explicit state (the TokenizerManager, the
server args): `native.py` (SGLang's /generate, /health, /get_model_info), `openai_api.py` (/v1),
`admin.py` (server info, metrics, cache flush, abort), `common.py` (API-key middleware, error
handlers, JSON bodies). `http_server.create_app` assembles them."""
