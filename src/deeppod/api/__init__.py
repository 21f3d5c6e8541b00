"""FastAPI control-plane API: thin routers over the service functions."""
