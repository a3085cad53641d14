"""Presentation of audit summaries: the terminal verdict table and the demo's HTML page."""

#: one colour per verdict, shared by every page and chart so a verdict looks the same everywhere
VERDICT_COLORS = {
    "healthy": "#2e7d32",
    "no_tensor_cores": "#f9a825",
    "memory_bound": "#ef6c00",
    "low_sm_efficiency": "#c62828",
    "underutilized": "#6a1b9a",
    "idle": "#546e7a",
    "low_mfu": "#00838f",
    "insufficient_data": "#9e9e9e",
}

#: one colour per metric, shared by every chart (console timelines, the demo page, the weekly
#: report), so SM activity is the same blue everywhere and waste the same red
METRIC_COLORS = {
    "gpu_util": "#78909c",
    "sm_active": "#1565c0",
    "tensor_active": "#2e7d32",
    "dram_active": "#ef6c00",
    "waste": "#c62828",
    "unmeasured": "#bdbdbd",
}
