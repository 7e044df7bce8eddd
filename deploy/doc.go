// Package deploy holds the tests of the Kubernetes kit: the Helm chart in
// helm/rls is rendered with its values files, every object is decoded
// strictly into Kubernetes' own types, and the container command it makes
// is run through the real rls binary (rls serve --dry-run). The Grafana
// dashboard's and the alert rules' expressions are parsed with Prometheus's
// PromQL parser and checked against the /metrics of a real rls on a real
// Redis, driven until every series they use appears.
//
// It is a Go module of its own so that Helm, the Kubernetes API types and
// Prometheus never enter rls's go.mod.
package deploy
