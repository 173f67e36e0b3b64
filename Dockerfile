# Code-server image: the locked dependencies in one layer, then the source; serves the code
# location over gRPC for a webserver and daemon running elsewhere.
FROM python:3.11.7-slim-bookworm

# Bytecode is compiled once at build (UV_COMPILE_BYTECODE): every run is a new process, and
# with PYTHONDONTWRITEBYTECODE each would compile its libraries from source again.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 UV_PROJECT_ENVIRONMENT=/opt/venv PATH=/opt/venv/bin:$PATH
RUN pip install --no-cache-dir uv==0.13.9

WORKDIR /app
COPY pyproject.toml uv.lock ./
RUN uv sync --frozen --no-dev --no-install-project

COPY README.md ./
# The production instance and workspace (deploy/), where webserver, daemon, runs and steps read
# them on ECS (deploy/cloudformation.yaml); the compose stack mounts its own over them.
COPY deploy/dagster.yaml deploy/workspace.yaml /opt/dagster/home/
COPY ml_platform ./ml_platform
RUN uv sync --frozen --no-dev

# Webserver and daemon run from this image too (deploy/docker-compose.yaml) and read their
# instance config from DAGSTER_HOME; the app user owns it, as nothing runs as root.
ENV DAGSTER_HOME=/opt/dagster/home
RUN useradd --create-home --uid 10001 app && mkdir -p $DAGSTER_HOME && chown app $DAGSTER_HOME
USER app
# matplotlib scans the system fonts into a cache on its first use (about 1.5 s): build the app
# user's cache into the image, or every run's fresh container would scan again.
RUN python -c "import matplotlib.font_manager"
EXPOSE 4000
# 0.0.0.0 inside the container: the webserver and daemon reach it from their own containers
# (compose publishes no port of it; on ECS only the platform's tasks may connect to 4000).
CMD ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", "4000", "-m", "ml_platform.definitions"]
