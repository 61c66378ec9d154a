// Package metricsdoc is test support: it reads the metric tables of
// docs/OBSERVABILITY.md and a Prometheus text scrape, and says where they
// differ (a family documented but not exported or the reverse, another
// type, an undocumented label or label value, a documented value with no
// series), so that a test can hold the documentation to what a real
// process serves.
package metricsdoc
