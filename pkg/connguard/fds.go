package connguard

import (
	"errors"
	"fmt"
	"log/slog"
)

// FDReserve is the file descriptors FitFDs keeps for what is not a
// connection of a capped port: the listeners, Redis's pool, config files,
// the xDS and OpenTelemetry connections.
const FDReserve = 256

// FDError says that the ports' caps add up to more file descriptors than
// the process may open: past the limit Accept fails (EMFILE) before a cap
// is reached, and no idle connection is evicted to make room.
type FDError struct {
	Max, Ports int    // the cap asked for, and the capped ports
	Limit      uint64 // RLIMIT_NOFILE
	Fitted     int    // the cap per port that fits, 0 if none does
}

func (e *FDError) Error() string {
	need := e.Max*e.Ports + FDReserve
	if e.Fitted == 0 {
		return fmt.Sprintf("%d connections on each of %d ports need %d file descriptors, but the process may open %d (RLIMIT_NOFILE): "+
			"raise the limit (ulimit -n, the container runtime's nofile)", e.Max, e.Ports, need, e.Limit)
	}
	return fmt.Sprintf("%d connections on each of %d ports need %d file descriptors, but the process may open %d (RLIMIT_NOFILE): "+
		"each port is capped at %d instead, so that the cap, not the descriptors, runs out first and idle connections make room; "+
		"raise the limit (ulimit -n, the container runtime's nofile) or lower the cap", e.Max, e.Ports, need, e.Limit, e.Fitted)
}

// FitFDs checks a cap of max connections on each of ports ports against
// limit, the process's file-descriptor limit (0: unknown, nothing to
// check), and returns the cap to use: max when it fits (or is 0, no cap),
// else the largest that fits with an *FDError saying so; with an FDError
// whose Fitted is 0 when not even one connection per port fits.
func FitFDs(max, ports int, limit uint64) (int, error) {
	if max <= 0 || ports <= 0 || limit == 0 || uint64(max*ports+FDReserve) <= limit {
		return max, nil
	}
	e := &FDError{Max: max, Ports: ports, Limit: limit}
	if limit > FDReserve+uint64(ports) {
		e.Fitted = int((limit - FDReserve) / uint64(ports))
	}
	return e.Fitted, e
}

// Ports counts the addresses that are set: the ports a server listens on.
func Ports(addrs ...string) int {
	n := 0
	for _, a := range addrs {
		if a != "" {
			n++
		}
	}
	return n
}

// Fit is FitFDs for the cap named name (in its messages) on ports with the
// given addresses (the empty ones are not open) under the process's limit:
// it logs a lowered cap as a warning, and returns an error only when not
// even one connection per port fits.
func Fit(name string, max int, addrs []string, log *slog.Logger) (int, error) {
	n, err := FitFDs(max, Ports(addrs...), FDLimit())
	var fe *FDError
	if errors.As(err, &fe) && fe.Fitted == 0 {
		return 0, fmt.Errorf("%s: %w", name, err)
	} else if err != nil {
		log.Warn(name+": lowered to fit the file-descriptor limit", "err", err, "max_conns", n)
	}
	return n, nil
}
