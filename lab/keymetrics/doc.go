// Package keymetrics prints, from a Prometheus gatherer, the figures an
// operator checks first after a run of the engine (batches and bytes, chunk
// outcomes, timeouts, restarts, finish and exposed-transfer quantiles).
// Quantiles are estimated from histogram buckets the way PromQL's
// histogram_quantile does, so that they match a dashboard. The metric
// names are system's (docs/OBSERVABILITY.md).
package keymetrics
