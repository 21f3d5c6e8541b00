"""Imported first by the loader workers' fork server (see ``data.worker_context``), in that
server process only: it ignores SIGTERM, and so does every worker it forks from birth, so a
launcher that signals the whole process group cannot kill them (or the server, which later
epochs' workers come from) before the training process has saved its checkpoint."""

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)
