// Package deploy holds the tests of the Kubernetes kit: the Helm chart in
// helm/rls is rendered with its values files, every object is decoded
// strictly into Kubernetes' own types, and the container command it makes
// is run through the real rls binary (rls serve --dry-run).
//
// It is a Go module of its own so that Helm and the Kubernetes API types
// never enter rls's go.mod.
package deploy
