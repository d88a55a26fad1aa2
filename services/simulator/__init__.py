"""A discrete-event model of the training pipeline that sizes a GPU run from measured stage times
(docs/performance.md, "Sizing a GPU run"): the processor-sharing engine (`engine`), trajectories
(`workload`), the pipeline (`pipeline`), GPU shapes and their rates (`gpu`), a run's own stage clocks
as inputs and the check against its measured times (`calibrate`), the search over layouts (`sizing`) and
the `searchr1 plan` commands (`commands`)."""
