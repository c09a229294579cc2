"""Column names of the tracker's DataFrames, defined once and used everywhere."""

# One row per kernel invocation (a parsed ORT profile, or a ReferenceEvaluator timing table).
OP_TYPE = "op_type"
NODE = "node_name"
PROVIDER = "provider"
RUN = "run"  # 0-based index of the inference run the invocation belongs to; -1 if outside any run
DUR_US = "dur_us"
TS_US = "ts_us"  # start, µs since the session's profiling start
THREAD = "tid"
# Element types and shapes as compact JSON in ORT's own form, e.g. '[{"float":[4,100]},{"float":[100,100]}]'
INPUT_SHAPES = "input_shapes"
OUTPUT_SHAPES = "output_shapes"
OUTPUT_SIZE = "output_size_bytes"
ACTIVATION_SIZE = "activation_size_bytes"
PARAMETER_SIZE = "parameter_size_bytes"
MEM_IN_USE_DELTA = "mem_in_use_delta_bytes"  # only in profiles of ORT releases with memory fields

EVENT_COLUMNS = (
    OP_TYPE,
    NODE,
    PROVIDER,
    RUN,
    DUR_US,
    TS_US,
    THREAD,
    INPUT_SHAPES,
    OUTPUT_SHAPES,
    OUTPUT_SIZE,
    ACTIVATION_SIZE,
    PARAMETER_SIZE,
    MEM_IN_USE_DELTA,
)
# The event columns of repeated strings: pandas categoricals in every per-invocation table.
LABEL_COLUMNS = (OP_TYPE, NODE, PROVIDER, THREAD, INPUT_SHAPES, OUTPUT_SHAPES)

# A summary: one row per key (op type, node or provider).
KEY = "key"
TOTAL_US = "total_us"
CALLS = "calls"
PCT = "pct"  # share of the summed kernel time, in percent
US_PER_RUN = "us_per_run"  # total_us / number of runs kept, so summaries of different run counts compare
CALLS_PER_RUN = "calls_per_run"
MEAN_US = "mean_us"  # per call
RUN_MEAN_US = "run_mean_us"  # spread across runs of the per-run time of this key
RUN_STD_US = "run_std_us"
RUN_MIN_US = "run_min_us"
RUN_MAX_US = "run_max_us"

SUMMARY_COLUMNS = (
    KEY,
    TOTAL_US,
    CALLS,
    PCT,
    US_PER_RUN,
    CALLS_PER_RUN,
    MEAN_US,
    RUN_MEAN_US,
    RUN_STD_US,
    RUN_MIN_US,
    RUN_MAX_US,
)

# The difference of two summaries (attempt vs baseline).
BASE_US_PER_RUN = "baseline_us_per_run"
ATTEMPT_US_PER_RUN = "attempt_us_per_run"
DELTA_US_PER_RUN = "delta_us_per_run"
BASE_CALLS_PER_RUN = "baseline_calls_per_run"
ATTEMPT_CALLS_PER_RUN = "attempt_calls_per_run"
DELTA_CALLS_PER_RUN = "delta_calls_per_run"
STATUS = "status"  # "both", "added" (only in the attempt) or "removed" (only in the baseline)

DIFF_COLUMNS = (
    KEY,
    BASE_US_PER_RUN,
    ATTEMPT_US_PER_RUN,
    DELTA_US_PER_RUN,
    BASE_CALLS_PER_RUN,
    ATTEMPT_CALLS_PER_RUN,
    DELTA_CALLS_PER_RUN,
    STATUS,
)
