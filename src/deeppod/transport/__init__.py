"""HTTP transport below the API and the S3 endpoint: ASGI extensions the server's wrapper offers
over uvicorn's request cycle (a large body read off the event loop, a file sent to the socket by
sendfile) and a request's body into a file. No routes and no services: both apps build on it."""
