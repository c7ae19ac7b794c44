"""Running ``helpers_child.py`` from tests: spawn it, read its lines as they come."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

CHILD = Path(__file__).with_name("helpers_child.py")


class Child:
    """A running child process whose stdout is read line by line (so the pipe never fills)."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr_path: Path) -> None:
        self.proc = proc
        self.stderr_path = stderr_path
        self._killed = False

    @classmethod
    async def spawn(cls, stderr_path: Path, *args: str) -> Child:
        """Start ``helpers_child.py *args``; its stderr goes to ``stderr_path``."""
        with stderr_path.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(CHILD), *args,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err)
        return cls(proc, stderr_path)

    async def line(self, timeout: float = 30.0) -> str | None:
        """The next line of output, or None at end of output."""
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        return raw.decode().rstrip("\n") if raw else None

    async def rest(self, timeout: float = 30.0) -> list[str]:
        """Every remaining line until the child's stdout closes."""
        out = []
        while (line := await self.line(timeout)) is not None:
            out.append(line)
        return out

    def kill(self) -> None:
        """SIGKILL the child once (no-op if it already exited or was killed).

        Only once: Popen.send_signal() polls first, and a poll that reaps the
        killed child before asyncio's watcher does makes wait() report 255.
        """
        if self.proc.returncode is None and not self._killed:
            self._killed = True
            self.proc.kill()

    async def wait(self, timeout: float = 30.0) -> int:
        """Wait for the exit status."""
        return await asyncio.wait_for(self.proc.wait(), timeout)

    def stderr(self) -> str:
        """What the child wrote to stderr so far."""
        return self.stderr_path.read_text(errors="replace")
