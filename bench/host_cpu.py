"""The CPU a benchmark ran on, for its header line: every benchmark states its CPU (the CPUs
vary between machines). Shared by the Python benchmarks under bench/ (they put bench/ on
sys.path)."""


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"
