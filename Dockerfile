# Recall app server. Point DATABASE_URL at PostgreSQL 15+ with pgvector; the
# embedded database is for single-machine use and is not used in containers.
FROM python:3.11-slim

# PYTHONPATH makes the code run from /app, where templates/ lives beside it.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    HOST=0.0.0.0 \
    PORT=8080

RUN useradd --create-home --uid 10001 recall
WORKDIR /app

COPY pyproject.toml constraints.txt README.md ./
COPY core ./core
COPY recall ./recall
COPY accounts ./accounts
COPY memories ./memories
COPY billing ./billing
COPY dashboard ./dashboard
COPY templates ./templates
COPY manage.py ./
# Static files are served by the app itself from the app directories.
RUN pip install --no-cache-dir -c constraints.txt .

USER recall
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=3s CMD python -c "import urllib.request,os; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"PORT\"]}/health')"
CMD ["recall", "serve"]
