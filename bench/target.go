package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// checkLoopback refuses any address whose host is not a loopback address
// (127.0.0.0/8, ::1) or "localhost": load tests only ever target this
// machine. No name is resolved.
func checkLoopback(flagName, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-%s %q: want host:port: %v", flagName, addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("-%s %q: bad port", flagName, addr)
	}
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("-%s %q: refusing a non-loopback host; rls-bench only targets 127.0.0.0/8, ::1 or localhost", flagName, addr)
}

// clockTicks is USER_HZ, the unit of utime/stime in /proc/<pid>/stat: 100 on
// every Linux architecture Go supports (sysconf(_SC_CLK_TCK)).
const clockTicks = 100

// parseProcStat returns utime+stime in clock ticks from /proc/<pid>/stat.
// The command name (field 2) may hold spaces and parentheses, so fields are
// counted from the last ')'.
func parseProcStat(b []byte) (uint64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat: no ')'")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("malformed stat: %d fields after comm", len(f))
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("malformed stat: %v", err)
	}
	return u + s, nil
}

// procCPU returns the summed user+system CPU time of pids.
func procCPU(pids []int) (time.Duration, error) {
	var ticks uint64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, fmt.Errorf("-server-pid %d: %v", pid, err)
		}
		t, err := parseProcStat(b)
		if err != nil {
			return 0, fmt.Errorf("-server-pid %d: %v", pid, err)
		}
		ticks += t
	}
	return time.Duration(ticks) * (time.Second / clockTicks), nil
}

// redisInfo is what one INFO reply tells about Redis's work so far.
type redisInfo struct {
	cpu      float64 // used_cpu_sys + used_cpu_user, seconds
	commands uint64  // total_commands_processed
	conns    uint64  // total_connections_received
	mem      uint64  // used_memory, bytes
	calls    map[string]uint64
}

// parseRedisInfo reads an INFO reply (sections cpu, stats, memory, commandstats).
func parseRedisInfo(s string) (redisInfo, error) {
	ri := redisInfo{calls: map[string]uint64{}}
	var haveCPU, haveCmds int
	for line := range strings.Lines(s) {
		k, v, ok := strings.Cut(strings.TrimRight(line, "\r\n"), ":")
		if !ok {
			continue
		}
		var err error
		switch {
		case k == "used_cpu_sys" || k == "used_cpu_user":
			var f float64
			f, err = strconv.ParseFloat(v, 64)
			ri.cpu += f
			haveCPU++
		case k == "total_commands_processed":
			ri.commands, err = strconv.ParseUint(v, 10, 64)
			haveCmds++
		case k == "used_memory":
			ri.mem, err = strconv.ParseUint(v, 10, 64)
		case k == "total_connections_received":
			ri.conns, err = strconv.ParseUint(v, 10, 64)
		case strings.HasPrefix(k, "cmdstat_"):
			err = parseCmdstat(ri.calls, strings.TrimPrefix(k, "cmdstat_"), v)
		}
		if err != nil {
			return ri, fmt.Errorf("INFO %s: %v", k, err)
		}
	}
	if haveCPU != 2 || haveCmds != 1 {
		return ri, errors.New("INFO reply lacks used_cpu_sys/used_cpu_user/total_commands_processed")
	}
	return ri, nil
}

// parseCmdstat records the calls of one commandstats line's value,
// "calls=12,usec=34,...", as calls[cmd].
func parseCmdstat(calls map[string]uint64, cmd, v string) error {
	for kv := range strings.SplitSeq(v, ",") {
		if n, ok := strings.CutPrefix(kv, "calls="); ok {
			c, err := strconv.ParseUint(n, 10, 64)
			if err != nil {
				return err
			}
			calls[cmd] = c
		}
	}
	return nil
}

// fetchRedisInfo sends one INFO command over a fresh connection, speaking
// just enough RESP to read the bulk-string reply.
func fetchRedisInfo(ctx context.Context, addr string) (redisInfo, error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return redisInfo{}, fmt.Errorf("redis %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	// "all" is every section but module-generated ones, commandstats included.
	if _, err := io.WriteString(c, "*2\r\n$4\r\nINFO\r\n$3\r\nall\r\n"); err != nil {
		return redisInfo{}, fmt.Errorf("redis %s: %v", addr, err)
	}
	body, err := readBulk(bufio.NewReader(c))
	if err != nil {
		return redisInfo{}, fmt.Errorf("redis %s INFO: %v", addr, err)
	}
	return parseRedisInfo(body)
}

func readBulk(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if strings.HasPrefix(line, "-") {
		return "", errors.New(line[1:])
	}
	if !strings.HasPrefix(line, "$") {
		return "", fmt.Errorf("unexpected reply %q", line)
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 0 || n > 64<<20 {
		return "", fmt.Errorf("unexpected reply %q", line)
	}
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(r, buf); err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
