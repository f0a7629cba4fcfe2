"""JVM options for the suite's JVMs: less start-up, compiler and GC CPU on a 2-core machine, same behaviour.

Serial GC (no parallel GC threads competing with the tests for 2 cores), no bytecode verification of the
classes on the class path (Spark's and Delta's pinned jars; verifying them is a large part of a JVM's
start), and the C1 compiler only: the suite's tables are tiny, so the JVM runs planning and commit code
a few times each and C2's compilations never pay off. C1 alone gets a 48 MB code cache by default, which
the session's JVM fills; the sweeper then throws code away and C1 compiles it again, so the cache is
256 MB. Measured on the 2-core VM:
- one `egolake run --stages ingest` over 3 small inputs: 52-61 CPU-s with the defaults, 30 CPU-s with
  serial GC, no verification and C1;
- `pytest tests/jobs/test_export.py tests/jobs/test_qa_stage.py` (one session JVM): its JVM 176 CPU-s
  with serial GC and no verification (75 of them in compiler threads), 147 with C1 added (11 in the
  sweeper), 105 with the code cache too; the command's wall time 232 -> 192 s.
"""

from __future__ import annotations

import os

__all__ = ["JVM_FLAGS", "java_options_env"]

JVM_FLAGS = (
    "-XX:+UseSerialGC",
    "-XX:+UnlockDiagnosticVMOptions",
    "-XX:-BytecodeVerificationRemote",
    "-XX:TieredStopAtLevel=1",
    "-XX:ReservedCodeCacheSize=256m",
)


def java_options_env() -> dict[str, str]:
    """This process's environment with `JVM_FLAGS` appended to JDK_JAVA_OPTIONS, which every `java` launch
    reads (Spark's launcher, driver, and a local cluster's daemons and executors, which inherit it)."""
    given = os.environ.get("JDK_JAVA_OPTIONS", "")
    return {**os.environ, "JDK_JAVA_OPTIONS": " ".join(filter(None, [given, *JVM_FLAGS]))}
