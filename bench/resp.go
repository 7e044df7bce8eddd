package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// respConn speaks just enough RESP2 to run a few commands on a loopback
// Redis after a run: requests as arrays of bulk strings, replies of every
// RESP2 type (nested arrays included).
type respConn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

// respError is an error reply ("-ERR ...").
type respError string

func (e respError) Error() string { return string(e) }

func dialRESP(ctx context.Context, addr string, deadline time.Duration) (*respConn, error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("redis %s: %v", addr, err)
	}
	_ = c.SetDeadline(time.Now().Add(deadline))
	return &respConn{c: c, r: bufio.NewReader(c), w: bufio.NewWriter(c)}, nil
}

func (rc *respConn) close() error { return rc.c.Close() }

// send buffers one command; flush writes what is buffered.
func (rc *respConn) send(args ...string) {
	writeCommand(rc.w, args...)
}

func (rc *respConn) flush() error { return rc.w.Flush() }

// do sends one command and reads its reply.
func (rc *respConn) do(args ...string) (any, error) {
	rc.send(args...)
	if err := rc.flush(); err != nil {
		return nil, err
	}
	return readReply(rc.r)
}

func writeCommand(w *bufio.Writer, args ...string) {
	fmt.Fprintf(w, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(w, "$%d\r\n%s\r\n", len(a), a)
	}
}

// readReply reads one RESP2 reply: a string (simple or bulk), an int64, nil
// (null bulk or array), a []any or a respError. A respError is returned as
// the value, not as the error, so that a pipeline's other replies can still
// be read; the error is for protocol and I/O failures.
func readReply(r *bufio.Reader) (any, error) {
	return readReplyDepth(r, 0)
}

func readReplyDepth(r *bufio.Reader, depth int) (any, error) {
	if depth > 8 {
		return nil, errors.New("RESP: arrays nested too deep")
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("RESP: empty line")
	}
	switch body := line[1:]; line[0] {
	case '+':
		return body, nil
	case '-':
		return respError(body), nil
	case ':':
		n, err := strconv.ParseInt(body, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("RESP: bad integer %q", body)
		}
		return n, nil
	case '$':
		return readBulkBody(r, body)
	case '*':
		return readArrayBody(r, body, depth)
	}
	return nil, fmt.Errorf("RESP: unexpected reply %q", line)
}

// readBulkBody reads a bulk string whose "$" line said body: a string, or
// nil for the null bulk string.
func readBulkBody(r *bufio.Reader, body string) (any, error) {
	n, err := strconv.Atoi(body)
	if err != nil || n < -1 || n > 64<<20 {
		return nil, fmt.Errorf("RESP: bad bulk length %q", body)
	}
	if n == -1 {
		return nil, nil
	}
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	return string(buf[:n]), nil
}

// readArrayBody reads the elements of an array whose "*" line said body:
// a []any, or nil for the null array.
func readArrayBody(r *bufio.Reader, body string, depth int) (any, error) {
	n, err := strconv.Atoi(body)
	if err != nil || n < -1 || n > 1<<20 {
		return nil, fmt.Errorf("RESP: bad array length %q", body)
	}
	if n == -1 {
		return nil, nil
	}
	out := make([]any, n)
	for i := range out {
		if out[i], err = readReplyDepth(r, depth+1); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// RedisKeys is what the keys a run left in Redis cost: -redis-key-sample.
type RedisKeys struct {
	DBSize uint64 `json:"dbsize"` // keys in the database after the run (DBSIZE)
	// MEMORY USAGE <key> SAMPLES 0 over up to -redis-key-sample keys found by
	// SCAN right after the run, averaged (keys that expired in between are
	// skipped).
	Sampled        int     `json:"sampled"`
	MeanBytes      float64 `json:"memory_usage_mean_bytes"`
	UsedMemoryFrom uint64  `json:"used_memory_before"` // INFO used_memory before the warm-up
	UsedMemoryTo   uint64  `json:"used_memory_after"`  // and after the run
	// (used_memory after - before) / DBSIZE: what each key costs with the
	// dictionary and expiry overhead MEMORY USAGE leaves out; client buffers
	// that changed in between are in it too.
	UsedMemoryPerKey float64 `json:"used_memory_delta_per_key"`
}

// sampleKeys measures DBSIZE and the mean MEMORY USAGE of up to n keys.
func sampleKeys(ctx context.Context, addr string, n int) (*RedisKeys, error) {
	rc, err := dialRESP(ctx, addr, 30*time.Second)
	if err != nil {
		return nil, err
	}
	defer rc.close()
	k := &RedisKeys{}
	v, err := rc.do("DBSIZE")
	if err != nil {
		return nil, fmt.Errorf("redis %s DBSIZE: %v", addr, err)
	}
	size, ok := v.(int64)
	if !ok || size < 0 {
		return nil, fmt.Errorf("redis %s DBSIZE: unexpected reply %v", addr, v)
	}
	k.DBSize = uint64(size)
	keys, err := scanKeys(rc, n)
	if err != nil {
		return nil, fmt.Errorf("redis %s SCAN: %v", addr, err)
	}
	for _, key := range keys {
		rc.send("MEMORY", "USAGE", key, "SAMPLES", "0")
	}
	if err := rc.flush(); err != nil {
		return nil, err
	}
	var sum int64
	for range keys {
		v, err := readReply(rc.r)
		if err != nil {
			return nil, fmt.Errorf("redis %s MEMORY USAGE: %v", addr, err)
		}
		switch x := v.(type) {
		case int64:
			sum += x
			k.Sampled++
		case nil: // expired since SCAN
		case respError:
			return nil, fmt.Errorf("redis %s MEMORY USAGE: %v", addr, x)
		default:
			return nil, fmt.Errorf("redis %s MEMORY USAGE: unexpected reply %v", addr, v)
		}
	}
	if k.Sampled > 0 {
		k.MeanBytes = float64(sum) / float64(k.Sampled)
	}
	return k, nil
}

// scanKeys returns up to n distinct keys, walking SCAN until it has them or
// the cursor returns to 0.
func scanKeys(rc *respConn, n int) ([]string, error) {
	seen := map[string]bool{}
	var keys []string
	cursor := "0"
	for len(keys) < n {
		v, err := rc.do("SCAN", cursor, "COUNT", "1000")
		if err != nil {
			return nil, err
		}
		if e, ok := v.(respError); ok {
			return nil, e
		}
		a, ok := v.([]any)
		if !ok || len(a) != 2 {
			return nil, fmt.Errorf("unexpected reply %v", v)
		}
		next, ok1 := a[0].(string)
		batch, ok2 := a[1].([]any)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("unexpected reply %v", v)
		}
		for _, b := range batch {
			s, ok := b.(string)
			if !ok {
				return nil, fmt.Errorf("unexpected key %v", b)
			}
			if !seen[s] && len(keys) < n {
				seen[s] = true
				keys = append(keys, s)
			}
		}
		if cursor = next; cursor == "0" {
			break
		}
	}
	return keys, nil
}
