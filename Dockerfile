# dpnode: the node only (the server and its `dpnode` command). No torch in this image:
# the node computes with NumPy; torch belongs to the SDK on the data scientist's machine.
#
#   docker build -t dpnode .
#   docker run -d -p 8000:8000 -v dpnode-data:/var/lib/dpnode \
#       -e DPNODE_TOKEN_SECRET="$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')" \
#       dpnode
#
# See docs/deploy.md for PostgreSQL, admin commands and the smoke test.

# Any Debian-like image with Python 3.11+, `python3 -m venv` and useradd will do.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/dpnode \
    PATH=/opt/dpnode/bin:$PATH

# The node runs as this unprivileged user; its only writable place is the data volume.
RUN groupadd --system --gid 10001 dpnode \
 && useradd --system --uid 10001 --gid dpnode --home-dir /var/lib/dpnode \
        --no-create-home --shell /usr/sbin/nologin dpnode \
 && install -d -o dpnode -g dpnode -m 0750 /var/lib/dpnode

# Dependencies first, in their own layer, read from pyproject.toml and pinned by
# constraints.txt (the versions CI tests): editing the node's code does not reinstall them.
# A virtualenv keeps them apart from the base image's Python (and works the same on bases
# whose system Python refuses pip installs, PEP 668).
COPY pyproject.toml constraints.txt /app/
RUN python3 -m venv "$VIRTUAL_ENV" \
 && python -c "import tomllib; p = tomllib.load(open('/app/pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['postgres'] + p['optional-dependencies']['s3'] + p['optional-dependencies']['dask']))" \
        > /tmp/requirements.txt \
 && pip install --upgrade pip \
 && pip install -c /app/constraints.txt -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# The node itself: a regular (non-editable) install into the virtualenv, migrations included
# (they ship inside the package, dpnode/node/migrations). pip compiles the bytecode, because
# the node's user cannot write it at run time. The last two checks fail the build, rather than
# the container at start, if torch crept in or a dependency is missing.
COPY . /app
RUN pip install --no-deps -c /app/constraints.txt "/app[postgres,s3,dask]" \
 && rm -rf /app \
 && python -c "import importlib.util, sys; sys.exit('torch must not be in the node image' if importlib.util.find_spec('torch') else 0)" \
 && python -c "import dpnode.node.app, dpnode.node.cli, dpnode.node.db.migrate as m; assert (m.MIGRATIONS_DIR / 'env.py').exists()"

# Production by default: the node refuses to start, with a message saying what to set, until
# DPNODE_TOKEN_SECRET holds a random string of at least 32 characters. Empty
# DPNODE_DATABASE_URL = an SQLite file in the data volume; set a postgresql+psycopg:// URL
# to use PostgreSQL (the driver is installed).
ENV DPNODE_ENVIRONMENT=production \
    DPNODE_DATA_DIR=/var/lib/dpnode \
    DPNODE_DATABASE_URL=""

VOLUME ["/var/lib/dpnode"]
WORKDIR /var/lib/dpnode
USER 10001:10001
EXPOSE 8000

# Python's own urllib: no curl in the image. The health route also runs a query on the
# database, so "healthy" means serving and connected. If you change the port in the
# command, change the URL here too (or override it with --health-cmd).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; r = urllib.request.urlopen('http://127.0.0.1:8000/api/v1/health', timeout=4); sys.exit(0 if r.status == 200 else 1)"]

# `dpnode serve` applies the database migrations (alembic upgrade head) before it accepts
# requests, so a new image upgrades the schema on start. The entrypoint is the `dpnode`
# command, so admin commands run with the same image: `docker run ... dpnode migrate`.
ENTRYPOINT ["dpnode"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
