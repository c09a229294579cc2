"""The cost model: FLOPs and bytes per kernel call, the machine's peaks, the roofline."""
