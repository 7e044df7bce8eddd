//go:build race

package service

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// allocation counts are not exact.
const raceEnabled = true
