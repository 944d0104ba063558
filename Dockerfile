FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY server server
COPY dashboard dashboard
COPY trainer_hooks trainer_hooks
COPY migrations migrations
RUN pip install --no-cache-dir ".[server]"
EXPOSE 8750
CMD ["keel", "serve", "--host", "0.0.0.0", "--port", "8750"]
