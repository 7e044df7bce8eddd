package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// twemproxyMissing is the failure message when nutcracker is not installed.
const twemproxyMissing = "nutcracker not found: run `apt-get install -y nutcracker` (make test does this)"

// Twemproxy is one nutcracker (twemproxy) process in front of Redis
// servers, listening on 127.0.0.1:Port and on a Unix socket.
type Twemproxy struct {
	Addr   string // "127.0.0.1:<Port>"
	Socket string // the Unix socket's path
	Log    string // its log file

	cmd  *exec.Cmd
	done chan struct{}
}

// StartTwemproxy starts nutcracker with two pools, one on a free loopback
// port and one on a Unix socket in t.TempDir(), both sharding keys over
// servers as upstream's example does (ketama, fnv1a_64), waits until both
// answer PING and registers a cleanup that kills it by PID.
func StartTwemproxy(t testing.TB, servers ...*Server) *Twemproxy {
	t.Helper()
	bin, err := exec.LookPath("nutcracker")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/nutcracker"); err != nil { // Debian's, off a user's PATH
			t.Fatal(twemproxyMissing)
		}
	}
	dir := t.TempDir()
	var lastErr error
	for range 5 {
		port, err := freePort(65535)
		if err != nil {
			t.Fatalf("redistest: pick a free port: %v", err)
		}
		p := &Twemproxy{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Socket: filepath.Join(dir, "nutcracker.sock"),
			Log: filepath.Join(dir, "nutcracker.log")}
		var pool strings.Builder
		for _, s := range servers {
			fmt.Fprintf(&pool, "   - %s:1\n", s.Addr)
		}
		conf := fmt.Sprintf("tcp:\n  listen: %s\n%s\nunix:\n  listen: %s 0666\n%s", p.Addr, poolConf(pool.String()), p.Socket, poolConf(pool.String()))
		confPath := filepath.Join(dir, "nutcracker.yml")
		if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		_ = os.Remove(p.Socket)
		stats, err := freePort(65535) // its stats port, which defaults to 22222 on every interface
		if err != nil {
			t.Fatalf("redistest: pick a free port: %v", err)
		}
		if lastErr = p.start(bin, confPath, dir, stats); lastErr == nil {
			t.Cleanup(p.Stop)
			return p
		}
	}
	t.Fatalf("redistest: start nutcracker: %v", lastErr)
	return nil
}

// poolConf is a pool's settings after its listen line.
func poolConf(servers string) string {
	return "  hash: fnv1a_64\n  distribution: ketama\n  redis: true\n  auto_eject_hosts: false\n  timeout: 2000\n  servers:\n" + servers
}

func (p *Twemproxy) start(bin, conf, dir string, stats int) error {
	cmd := exec.Command(bin, "-c", conf, "-o", p.Log, "-s", strconv.Itoa(stats), "-a", "127.0.0.1")
	cmd.Dir = dir
	cmd.SysProcAttr = ChildAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("nutcracker exited: %s", tail(p.Log))
		default:
		}
		if pingRESP("tcp", p.Addr) == nil && pingRESP("unix", p.Socket) == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.Stop()
	return fmt.Errorf("nutcracker did not answer PING within %v: %s", startTimeout, tail(p.Log))
}

// pingRESP sends one PING as a RESP array (nutcracker parses no inline
// commands) on a fresh connection with a short deadline.
func pingRESP(network, addr string) error {
	c, err := net.DialTimeout(network, addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// URL is the redis:// URL of its TCP pool.
func (p *Twemproxy) URL() string { return "redis://" + p.Addr }

// SocketURL is the unix:// URL of its socket's pool.
func (p *Twemproxy) SocketURL() string { return "unix://" + p.Socket }

// Unsupported returns the commands nutcracker refused so far, from its log
// ("parsed unsupported command 'hello'").
func (p *Twemproxy) Unsupported() []string {
	b, _ := os.ReadFile(p.Log)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if _, cmd, ok := strings.Cut(line, "unsupported command "); ok {
			out = append(out, strings.Trim(cmd, "'"))
		}
	}
	return out
}

// Stop kills nutcracker by PID and waits for it to exit, at most 10 s.
func (p *Twemproxy) Stop() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}
