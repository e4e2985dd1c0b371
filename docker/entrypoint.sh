#!/bin/sh
# The entrypoint of both images (docker/Dockerfile, docker/Dockerfile.cpu): JupyterLab serving
# the learners' work folder on 0.0.0.0:8888 inside the container, never without a token.
#
#   no arguments, or options   JupyterLab (options go to `jupyter lab`)
#   a command                  that command instead, e.g.
#                              docker run --rm fsdp-mini:cpu fsdp-mini compare --world-size 2
#
# JUPYTER_TOKEN   required for JupyterLab: empty or unset, it refuses to start (one line on stderr,
#                 exit status 2); no token is ever generated. JupyterLab reads it from the
#                 environment, so it never shows on a command line.
# FSDP_MINI_WORK  the learners' folder (default ~/work, where compose mounts a volume). On the
#                 first start, when it is empty, the labs are copied there; later starts keep it.
# JUPYTER_PORT    the port inside the container (default 8888).
set -eu

case "${1:-}" in
    "" | -*) ;;      # JupyterLab, below
    *) exec "$@" ;;  # a command of its own: no server, no token needed
esac

if [ -z "${JUPYTER_TOKEN:-}" ]; then
    echo "fsdp-mini-lab: error: JUPYTER_TOKEN is empty; JupyterLab never starts without a token: pass one, e.g. -e JUPYTER_TOKEN=\$(openssl rand -hex 24)" >&2
    exit 2
fi

work="${FSDP_MINI_WORK:-$HOME/work}"
mkdir -p "$work"
if [ ! -w "$work" ]; then
    echo "fsdp-mini-lab: error: $work is not writable by $(id -un) (uid $(id -u)); a bind mount? use a named volume, or chown it to uid $(id -u)" >&2
    exit 2
fi
if [ -z "$(ls -A "$work")" ]; then
    # Note: the pristine labs stay in /opt/fsdp_mini/labs (and `labs.show_solution` finds the
    # solutions there too); the copy is the learners' own.
    cp -R /opt/fsdp_mini/labs/. "$work/"
    echo "fsdp-mini-lab: first start: copied the labs to $work"
fi

# Note: --port-retries 0: another port would not be the one the container publishes.
exec jupyter lab --no-browser --ip 0.0.0.0 --port "${JUPYTER_PORT:-8888}" --port-retries 0 \
    --ServerApp.root_dir="$work" "$@"
