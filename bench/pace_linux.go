package main

import (
	"time"

	"golang.org/x/sys/unix"
)

// sleepUntil returns at t, or false as soon as stop is closed. Go's timers
// wake an idle process with millisecond granularity (epoll's timeout), which
// at a few thousand requests/s would send most requests up to 1 ms late
// and count the generator's lateness as the server's latency. So the last
// stretch is an absolute clock_nanosleep on the monotonic clock, which the
// kernel honours to within tens of µs. Call it from a goroutine locked to
// its thread: the thread blocks.
func sleepUntil(t time.Time, stop <-chan struct{}) bool {
	const coarse = 2 * time.Millisecond
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	if d > coarse {
		tm := time.NewTimer(d - coarse)
		select {
		case <-tm.C:
		case <-stop:
			tm.Stop()
			return false
		}
	}
	select {
	case <-stop:
		return false
	default:
	}
	if d = time.Until(t); d <= 0 {
		return true
	}
	var now unix.Timespec
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &now) != nil {
		time.Sleep(d)
		return true
	}
	at := unix.NsecToTimespec(now.Nano() + int64(d))
	for unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &at, nil) == unix.EINTR {
	}
	return true
}
