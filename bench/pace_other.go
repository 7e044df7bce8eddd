//go:build !linux

package main

import "time"

// sleepUntil returns at t, or false as soon as stop is closed. Elsewhere
// than Linux it relies on Go's timers, which may wake an idle process up
// to a millisecond late; the report's schedule lag shows how late.
func sleepUntil(t time.Time, stop <-chan struct{}) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-stop:
		return false
	}
}
