# The Keel server: the `.[server]` install (no torch, no learners/), run by docker-compose.yml.
# tests/test_image.py installs exactly what this file copies, the way it installs it, and runs
# the compose file's commands on it: keep COPY, RUN and CMD plain enough for it to read.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1
# Not root: the server needs no privilege and writes nothing but its database (PostgreSQL,
# or ~/.keel for SQLite).
RUN useradd --create-home --uid 10001 keel
WORKDIR /app
COPY pyproject.toml README.md ./
COPY keel keel
COPY server server
COPY dashboard dashboard
COPY trainer_hooks trainer_hooks
COPY wire wire
COPY migrations migrations
RUN pip install --no-cache-dir ".[server]"
USER keel
EXPOSE 8750
CMD ["keel", "serve", "--host", "0.0.0.0", "--port", "8750"]
