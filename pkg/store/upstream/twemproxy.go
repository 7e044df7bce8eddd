package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Detect reports whether the server at o.URL (a single Redis's address,
// redis:// or unix://) is a twemproxy (nutcracker) rather than a Redis: on
// one RESP2 connection it sends AUTH (when o has a password) and PING, then
// TIME. A Redis answers TIME (or refuses it with an error reply, as it
// refuses anything before AUTH); twemproxy, which proxies no TIME, closes
// the connection without a word, as it does on HELLO. A server that cannot
// be reached, or that closes the connection before TIME, tells nothing:
// the error says why. rediss:// and the other modes are never twemproxy
// (it has no TLS and stands for one Redis). Detect is bounded by ctx.
func Detect(ctx context.Context, o ClientOptions) (bool, error) {
	if o.Twemproxy {
		return true, nil
	}
	u, network, addr := plainAddr(o)
	if u == nil {
		return false, nil
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	}
	r := bufio.NewReader(conn)
	for _, c := range greeting(o, u) {
		if _, err := conn.Write(resp(c...)); err != nil {
			return false, err
		}
		if _, err := r.ReadString('\n'); err != nil {
			return false, fmt.Errorf("no answer to %s: %w", c[0], err)
		}
	}
	if _, err := conn.Write(resp("TIME")); err != nil {
		return false, err
	}
	if _, err := r.ReadString('\n'); err != nil {
		if closed(err) {
			return true, nil
		}
		return false, fmt.Errorf("no answer to TIME: %w", err)
	}
	return false, nil // an array (Redis) or an error reply: not twemproxy
}

// plainAddr returns the URL, network and address of o's server, or a nil
// URL where o cannot name a twemproxy (not one plain Redis: another mode,
// TLS, rediss://).
func plainAddr(o ClientOptions) (u *url.URL, network, addr string) {
	u, err := url.Parse(o.URL)
	if err != nil || (o.Mode != "" && o.Mode != ModeSingle) || o.TLSConfig != nil {
		return nil, "", ""
	}
	switch u.Scheme {
	case "redis":
		return u, "tcp", u.Host
	case "unix":
		return u, "unix", u.Path
	}
	return nil, "", ""
}

// greeting returns the commands Detect sends before TIME: AUTH with the
// credentials of o, else of u (when there is a password), and PING.
func greeting(o ClientOptions, u *url.URL) [][]string {
	user, pass := o.Username, o.Password
	if u.User != nil {
		if user == "" {
			user = u.User.Username()
		}
		if p, ok := u.User.Password(); ok && pass == "" {
			pass = p
		}
	}
	var cmds [][]string
	switch {
	case pass == "":
	case user != "" && user != "default":
		cmds = append(cmds, []string{"AUTH", user, pass})
	default:
		cmds = append(cmds, []string{"AUTH", pass})
	}
	return append(cmds, []string{"PING"})
}

// closed reports whether err is the peer closing the connection.
func closed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// resp encodes a command as a RESP array of bulk strings.
func resp(args ...string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return []byte(b.String())
}

// DetectLate wraps ready, a Redis store's readiness probe: until ready
// first succeeds, each failure asks Detect whether o.URL is a twemproxy
// after all (one not reachable at start), and calls found if it is.
func DetectLate(ready func(context.Context) error, o ClientOptions, found func()) func(context.Context) error {
	var answered atomic.Bool
	return func(ctx context.Context) error {
		err := ready(ctx)
		if err == nil || answered.Load() {
			answered.Store(err == nil || answered.Load())
			return err
		}
		if tw, _ := Detect(ctx, o); tw {
			found()
		}
		return err
	}
}
