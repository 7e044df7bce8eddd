package main

import (
	"testing"
	"time"
)

func TestSleepUntilNeverEarly(t *testing.T) {
	stop := make(chan struct{})
	for _, d := range []time.Duration{-time.Millisecond, 0, 300 * time.Microsecond, 3 * time.Millisecond} {
		at := time.Now().Add(d)
		if !sleepUntil(at, stop) {
			t.Fatalf("sleepUntil(now%+v) = false with stop open", d)
		}
		if now := time.Now(); now.Before(at) {
			t.Errorf("sleepUntil(now%+v) returned %v early", d, at.Sub(now))
		}
	}
}

func TestSleepUntilStops(t *testing.T) {
	stop := make(chan struct{})
	close(stop)
	if sleepUntil(time.Now().Add(time.Hour), stop) {
		t.Fatal("sleepUntil an hour ahead returned true with stop closed")
	}
	// Due already: the slot is released even though the run is stopping;
	// the worker checks stop before sending it.
	if !sleepUntil(time.Now().Add(-time.Second), stop) {
		t.Fatal("sleepUntil a past time returned false")
	}
}
