#!/bin/sh
# The entrypoint of both images (docker/Dockerfile, docker/Dockerfile.cpu): JupyterLab serving
# the learners' work folder on 0.0.0.0:8888 inside the container, never without a token.
#
#   no arguments, or options   JupyterLab (options go to `jupyter lab`)
#   a command                  that command instead, e.g.
#                              docker run --rm fsdp-mini:cpu fsdp-mini compare --world-size 2
#
# JUPYTER_TOKEN   required for JupyterLab: empty or unset, it refuses to start (one line on stderr,
#                 exit status 2), and so it does for one no one could type (only whitespace,
#                 whitespace around it, a control character); no token is ever generated.
#                 JupyterLab reads it from the environment, so it never shows on a command line.
# FSDP_MINI_WORK  the learners' folder (default ~/work, where compose mounts a volume). On the
#                 first start, when it is empty, the labs are copied there; later starts keep it.
# JUPYTER_PORT    the port inside the container (default 8888), from 1 to 65535.
set -eu

case "${1:-}" in
    "" | -*) ;;      # JupyterLab, below
    *) exec "$@" ;;  # a command of its own: no server, no token needed
esac

if [ -z "${JUPYTER_TOKEN:-}" ]; then
    echo "fsdp-mini-lab: error: JUPYTER_TOKEN is empty; JupyterLab never starts without a token: pass one, e.g. -e JUPYTER_TOKEN=\$(openssl rand -hex 24)" >&2
    exit 2
fi
# Note: a token no one can type (blanks only, blanks around it, a tab, a newline, an escape) would
# start a server that refuses every request; the messages never show the token itself.
token_problem=""
case "$JUPYTER_TOKEN" in
    *[![:space:]]*) ;;
    *) token_problem="is only whitespace: no one could type it, and JupyterLab would refuse every request" ;;
esac
if [ -z "$token_problem" ]; then
    case "$JUPYTER_TOKEN" in
        *[[:cntrl:]]*) token_problem="holds a control character (a tab, a newline, an escape...): no one could type it, and JupyterLab would refuse every request" ;;
        [[:space:]]* | *[[:space:]]) token_problem="starts or ends with whitespace: the token as typed or pasted, without it, would be refused" ;;
    esac
fi
if [ -n "$token_problem" ]; then
    echo "fsdp-mini-lab: error: JUPYTER_TOKEN $token_problem; pass the token alone, letters and digits, e.g. -e JUPYTER_TOKEN=\$(openssl rand -hex 24)" >&2
    exit 2
fi
port="${JUPYTER_PORT-8888}"
case "$port" in
    "" | *[!0-9]* | ??????*) port_ok=no ;;
    *) if [ "$port" -ge 1 ] && [ "$port" -le 65535 ]; then port_ok=yes; else port_ok=no; fi ;;
esac
if [ "$port_ok" = no ]; then
    echo "fsdp-mini-lab: error: JUPYTER_PORT is '$port': give a TCP port from 1 to 65535 (the port inside the container; unset, it is 8888)" >&2
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
exec jupyter lab --no-browser --ip 0.0.0.0 --port "$port" --port-retries 0 \
    --ServerApp.root_dir="$work" "$@"
