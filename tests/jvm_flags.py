"""JVM options for the suite's JVMs: less start-up and compiler CPU on a 2-core machine, same behaviour.

Serial GC (no parallel GC threads competing with the tests for 2 cores) and no bytecode verification
of the classes on the class path (Spark's and Delta's pinned jars; verifying them is a large part of a
JVM's start). JVMs that live for one command (the `egolake` and `spark-submit` subprocesses) also stop
at the C1 compiler: they end before C2's compilations pay off. Measured on the 2-core VM: one
`egolake run --stages ingest` over 3 small inputs, 52-61 CPU-s with the defaults, 30 CPU-s with these.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["SESSION_JVM_FLAGS", "SHORT_JVM_FLAGS", "java_options_env"]

SESSION_JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:+UnlockDiagnosticVMOptions", "-XX:-BytecodeVerificationRemote")
SHORT_JVM_FLAGS = (*SESSION_JVM_FLAGS, "-XX:TieredStopAtLevel=1")


def java_options_env(flags: tuple[str, ...], base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """`base` with `flags` appended to JDK_JAVA_OPTIONS, which every `java` launch reads (Spark's launcher,
    driver, and a local cluster's daemons and executors, which inherit the environment)."""
    given = base.get("JDK_JAVA_OPTIONS", "")
    return {**base, "JDK_JAVA_OPTIONS": " ".join(filter(None, [given, *flags]))}
