#!/bin/sh
# A parent that does nothing: drops `run ARGS... --` and runs the command as its child, waiting.
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
"$@"
