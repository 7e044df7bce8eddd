package main

// A minimal gRPC client for unary calls over cleartext HTTP/2 (h2c, prior
// knowledge). It exists so that the load generator spends far less CPU per
// call than grpc-go's ClientConn: one connection, one reader goroutine,
// writes batched in the calling goroutines, pooled per-call state.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	h2Preface        = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	h2BufSize        = 32 << 10
	h2RecvWindow     = 1 << 30 // our stream and connection receive windows
	h2RecvUpdate     = 1 << 29 // send WINDOW_UPDATE once this much is unacknowledged
	h2DefaultWindow  = 65535   // RFC 9113 initial window size
	h2DefaultFrame   = 16384   // RFC 9113 initial SETTINGS_MAX_FRAME_SIZE
	h2MaxWindow      = 1<<31 - 1
	h2MaxStreamID    = 1<<31 - 1
	h2GRPCPrefixSize = 5
)

// h2conn is one HTTP/2 connection carrying unary gRPC calls.
//
// Lock order: wmu before mu. The reader goroutine never holds mu while
// taking wmu.
type h2conn struct {
	nc   net.Conn
	auth string // :authority
	fr   *http2.Framer

	// Write side, guarded by wmu. waiting counts goroutines between
	// "about to take wmu" and "done writing"; whoever brings it to zero
	// flushes bw, so concurrent writers share one write syscall.
	wmu     sync.Mutex
	waiting atomic.Int32
	bw      *bufio.Writer
	henc    *hpack.Encoder
	hbuf    bytes.Buffer
	fhdr    [9]byte       // DATA frame header scratch
	toDur   time.Duration // last encoded grpc-timeout
	toStr   string

	// Stream state, guarded by mu.
	mu          sync.Mutex
	cond        sync.Cond // on mu: send window, stream slots, failure
	condWaiters int
	calls       map[uint32]*h2call
	nextID      uint32
	active      uint32 // open streams counted against maxStreams
	maxStreams  uint32 // peer's SETTINGS_MAX_CONCURRENT_STREAMS
	maxFrame    uint32 // peer's SETTINGS_MAX_FRAME_SIZE
	initWin     int64  // peer's SETTINGS_INITIAL_WINDOW_SIZE
	connWin     int64  // our connection send window
	goaway      bool   // peer sent GOAWAY: no new streams
	err         error  // terminal: set once, fails every call

	// Reader goroutine only.
	recvUnacked uint32
	readerDone  chan struct{}
	closeOnce   sync.Once
}

// h2call is the per-call state, pooled. Fields below "reader" are written
// by the reader goroutine under c.mu while the call is in c.calls; the
// caller reads them only after receiving on done (or after removing the call
// from c.calls itself).
type h2call struct {
	id     uint32
	done   chan struct{} // 1-buffered; signaled once when the call ends
	prefix [h2GRPCPrefixSize]byte
	total  int // prefix + request bytes
	sent   int // bytes of prefix+request sent (caller only)
	// deadline is when the grpc-timeout sent expires (zero: none). It
	// is set before the call is published to the reader.
	deadline time.Time

	// reader
	sendWin     int64
	ended       bool // removed from c.calls
	noRST       bool // the stream is already closed at the peer
	gotHeaders  bool
	msgHdr      [h2GRPCPrefixSize]byte
	msgHdrN     int    // bytes of the current message prefix seen
	need        uint32 // bytes of the current message still to come
	nmsg        int
	recvUnacked uint32
	buf         []byte
	err         error
}

var h2CallPool = sync.Pool{New: func() any { return &h2call{done: make(chan struct{}, 1)} }}

// h2ProtoError is a connection-level protocol violation by the peer.
type h2ProtoError struct {
	code http2.ErrCode
	msg  string
}

func (e *h2ProtoError) Error() string { return e.msg }

func h2Unavailable(format string, args ...any) error {
	return status.Errorf(codes.Unavailable, "h2: "+format, args...)
}

func h2Internal(format string, args ...any) error {
	return status.Errorf(codes.Internal, "h2: "+format, args...)
}

// dialH2 opens one cleartext HTTP/2 connection (prior knowledge, "h2c") to
// addr (host:port) and performs the connection preface and SETTINGS
// exchange.
func dialH2(ctx context.Context, addr string) (*h2conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, h2Unavailable("dial %s: %v", addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	c := &h2conn{
		nc:         nc,
		auth:       addr,
		bw:         bufio.NewWriterSize(nc, h2BufSize),
		calls:      make(map[uint32]*h2call),
		nextID:     1,
		maxStreams: math.MaxUint32,
		maxFrame:   h2DefaultFrame,
		initWin:    h2DefaultWindow,
		connWin:    h2DefaultWindow,
		readerDone: make(chan struct{}),
	}
	c.cond.L = &c.mu
	c.fr = http2.NewFramer(c.bw, bufio.NewReaderSize(nc, h2BufSize))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.SetReuseFrames()
	c.henc = hpack.NewEncoder(&c.hbuf)

	// ctx bounds the handshake: its end (cancel or deadline) unblocks
	// the connection's reads and writes.
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	err = c.handshake()
	if !stop() || (err != nil && ctx.Err() != nil) {
		nc.Close()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if err != nil {
		nc.Close()
		var pe *h2ProtoError
		if errors.As(err, &pe) {
			return nil, h2Internal("handshake with %s: %v", addr, err)
		}
		return nil, h2Unavailable("handshake with %s: %v", addr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	go c.readLoop()
	return c, nil
}

// handshake sends the preface, our SETTINGS and connection WINDOW_UPDATE,
// then reads the server's SETTINGS (which must come first), applies and
// acknowledges it. The server's ACK of our SETTINGS is read by the reader.
func (c *h2conn) handshake() error {
	if _, err := c.bw.WriteString(h2Preface); err != nil {
		return err
	}
	if err := c.fr.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2RecvWindow},
	); err != nil {
		return err
	}
	if err := c.fr.WriteWindowUpdate(0, h2RecvWindow-h2DefaultWindow); err != nil {
		return err
	}
	if err := c.bw.Flush(); err != nil {
		return err
	}
	f, err := c.fr.ReadFrame()
	if err != nil {
		return err
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		return &h2ProtoError{http2.ErrCodeProtocol, fmt.Sprintf("expected SETTINGS from server, got %v", f.Header().Type)}
	}
	return c.onSettings(sf)
}

// Invoke sends one unary gRPC call and blocks until its response trailers
// arrive, ctx ends, or the connection fails. path is the full method path;
// req is the marshalled request without the gRPC length prefix (Invoke adds
// it, uncompressed); timeout > 0 is sent as grpc-timeout. The response
// message is appended to dst[:0] and returned. Errors are gRPC status
// errors: the server's status; Canceled or DeadlineExceeded when ctx ends
// (the stream is reset with CANCEL) or when the server resets it with
// CANCEL after the grpc-timeout expired (as grpc-go servers do);
// Unavailable when the connection is closed, fails or is drained by
// GOAWAY, or the server refuses the stream; Internal for protocol
// violations.
func (c *h2conn) Invoke(ctx context.Context, path string, req []byte, timeout time.Duration, dst []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return dst[:0], status.FromContextError(err).Err()
	}
	if uint64(len(req)) > math.MaxUint32 {
		return dst[:0], status.Errorf(codes.ResourceExhausted, "h2: request message too large (%d bytes)", len(req))
	}
	call := h2CallPool.Get().(*h2call)
	call.buf = dst[:0]
	call.total = h2GRPCPrefixSize + len(req)
	call.prefix = [h2GRPCPrefixSize]byte{0, byte(len(req) >> 24), byte(len(req) >> 16), byte(len(req) >> 8), byte(len(req))}
	if timeout > 0 {
		call.deadline = time.Now().Add(timeout)
	}

	var stop func() bool // context.AfterFunc waking cond waiters; slow paths only
	out, err := c.invoke(ctx, call, path, req, timeout, &stop)
	if stop != nil {
		stop()
	}
	*call = h2call{done: call.done}
	h2CallPool.Put(call)
	return out, err
}

func (c *h2conn) invoke(ctx context.Context, call *h2call, path string, req []byte, timeout time.Duration, stop *func() bool) ([]byte, error) {
	// Open the stream: take a slot, an id and what send window there is,
	// and write HEADERS plus as much DATA as fits, all under wmu so stream
	// ids reach the wire in increasing order.
	for {
		c.waiting.Add(1)
		c.wmu.Lock()
		c.mu.Lock()
		var err error
		switch {
		case c.err != nil:
			err = c.err
		case c.goaway:
			err = h2Unavailable("connection is draining (GOAWAY received)")
		case c.nextID > h2MaxStreamID:
			err = h2Unavailable("stream ids exhausted")
		}
		if err != nil {
			c.mu.Unlock()
			c.endWrite(nil)
			return call.buf, err
		}
		if c.active < c.maxStreams {
			break // with wmu and mu held
		}
		c.mu.Unlock()
		c.endWrite(nil)
		// Wait for a stream slot.
		c.mu.Lock()
		for c.active >= c.maxStreams && c.err == nil && !c.goaway && ctx.Err() == nil {
			c.waitLocked(ctx, stop)
		}
		c.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return call.buf, status.FromContextError(err).Err()
		}
	}
	id := c.nextID
	c.nextID += 2
	call.id = id
	c.active++
	c.calls[id] = call
	call.sendWin = c.initWin
	n := int(max(0, min(int64(call.total), c.connWin, call.sendWin)))
	c.connWin -= int64(n)
	call.sendWin -= int64(n)
	maxFrame := int(c.maxFrame)
	c.mu.Unlock()

	err := c.writeHeaders(id, path, timeout, maxFrame)
	if err == nil {
		err = c.writeData(call, req, n, maxFrame)
	}
	c.endWrite(err) // on failure the reader fails the call

	// Rest of a request larger than the send windows.
	for call.sent < call.total {
		c.mu.Lock()
		for !call.ended && ctx.Err() == nil && min(c.connWin, call.sendWin) <= 0 {
			c.waitLocked(ctx, stop)
		}
		if call.ended {
			c.mu.Unlock()
			break
		}
		if ctx.Err() != nil {
			c.mu.Unlock()
			return c.abandon(ctx, call)
		}
		n := int(min(int64(call.total-call.sent), c.connWin, call.sendWin))
		c.connWin -= int64(n)
		call.sendWin -= int64(n)
		maxFrame := int(c.maxFrame)
		c.mu.Unlock()

		c.waiting.Add(1)
		c.wmu.Lock()
		c.endWrite(c.writeData(call, req, n, maxFrame))
	}

	select {
	case <-call.done:
	case <-ctx.Done():
		return c.abandon(ctx, call)
	}
	if call.sent < call.total && !call.noRST {
		// The server answered before reading the whole request; close
		// our half of the stream.
		c.writeRST(call.id, http2.ErrCodeCancel)
	}
	if call.err != nil {
		return call.buf[:0], call.err
	}
	return call.buf, nil
}

// abandon ends a call whose ctx is done: unless the reader finished it
// meanwhile, it is removed and the stream reset with CANCEL.
func (c *h2conn) abandon(ctx context.Context, call *h2call) ([]byte, error) {
	c.mu.Lock()
	if call.ended {
		c.mu.Unlock()
		<-call.done
		if call.err != nil {
			return call.buf[:0], call.err
		}
		return call.buf, nil
	}
	call.noRST = true
	c.removeLocked(call)
	c.mu.Unlock()
	c.writeRST(call.id, http2.ErrCodeCancel)
	return call.buf[:0], status.FromContextError(ctx.Err()).Err()
}

// waitLocked waits on c.cond (c.mu held), arranging first for ctx's end to
// wake it.
func (c *h2conn) waitLocked(ctx context.Context, stop *func() bool) {
	if *stop == nil && ctx.Done() != nil {
		*stop = context.AfterFunc(ctx, c.wake)
	}
	c.condWaiters++
	c.cond.Wait()
	c.condWaiters--
}

func (c *h2conn) wake() {
	c.mu.Lock()
	c.cond.Broadcast()
	c.mu.Unlock()
}

// removeLocked takes call out of the open streams and wakes cond waiters.
func (c *h2conn) removeLocked(call *h2call) {
	delete(c.calls, call.id)
	c.active--
	call.ended = true
	if c.condWaiters > 0 {
		c.cond.Broadcast()
	}
}

// finishLocked ends call with err (nil: success) and signals its caller.
func (c *h2conn) finishLocked(call *h2call, err error) {
	c.removeLocked(call)
	call.err = err
	call.done <- struct{}{}
}

// endWrite ends a write section begun with waiting.Add(1) and wmu.Lock():
// the last writer out flushes. Before flushing it yields once, so callers
// woken together (by a burst of responses) queue their requests behind it
// and share one write, as an event loop such as Envoy's writes once per
// wake-up; a lone caller finds nothing else to run and flushes at once.
// A write error tears the connection down; the reader then fails every call.
func (c *h2conn) endWrite(err error) {
	if c.waiting.Add(-1) == 0 && err == nil {
		runtime.Gosched()
		if c.waiting.Load() == 0 {
			err = c.bw.Flush()
		}
	}
	if err != nil {
		c.mu.Lock()
		if c.err == nil {
			c.err = h2Unavailable("write: %v", err)
		}
		c.mu.Unlock()
		c.nc.Close()
	}
	c.wmu.Unlock()
}

// writeHeaders encodes and writes the request HEADERS (wmu held).
func (c *h2conn) writeHeaders(id uint32, path string, timeout time.Duration, maxFrame int) error {
	c.hbuf.Reset()
	e := c.henc
	e.WriteField(hpack.HeaderField{Name: ":method", Value: "POST"})
	e.WriteField(hpack.HeaderField{Name: ":scheme", Value: "http"})
	e.WriteField(hpack.HeaderField{Name: ":path", Value: path})
	e.WriteField(hpack.HeaderField{Name: ":authority", Value: c.auth})
	e.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
	e.WriteField(hpack.HeaderField{Name: "te", Value: "trailers"})
	if timeout > 0 {
		if timeout != c.toDur {
			c.toDur, c.toStr = timeout, encodeGRPCTimeout(timeout)
		}
		e.WriteField(hpack.HeaderField{Name: "grpc-timeout", Value: c.toStr})
	}
	block := c.hbuf.Bytes()
	frag := block[:min(len(block), maxFrame)]
	block = block[len(frag):]
	err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: frag, EndHeaders: len(block) == 0})
	for err == nil && len(block) > 0 {
		frag = block[:min(len(block), maxFrame)]
		block = block[len(frag):]
		err = c.fr.WriteContinuation(id, len(block) == 0, frag)
	}
	return err
}

// writeData writes the next n bytes of prefix+req as DATA frames of at most
// maxFrame bytes, END_STREAM on the frame that completes the message (wmu
// held).
func (c *h2conn) writeData(call *h2call, req []byte, n, maxFrame int) error {
	for n > 0 {
		m := min(n, maxFrame)
		var flags byte
		if call.sent+m == call.total {
			flags = byte(http2.FlagDataEndStream)
		}
		id := call.id
		c.fhdr = [9]byte{byte(m >> 16), byte(m >> 8), byte(m), byte(http2.FrameData), flags,
			byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id)}
		if _, err := c.bw.Write(c.fhdr[:]); err != nil {
			return err
		}
		off, end := call.sent, call.sent+m
		if off < h2GRPCPrefixSize {
			k := min(h2GRPCPrefixSize, end)
			if _, err := c.bw.Write(call.prefix[off:k]); err != nil {
				return err
			}
			off = k
		}
		if off < end {
			if _, err := c.bw.Write(req[off-h2GRPCPrefixSize : end-h2GRPCPrefixSize]); err != nil {
				return err
			}
		}
		call.sent = end
		n -= m
	}
	return nil
}

func (c *h2conn) writeRST(id uint32, code http2.ErrCode) {
	c.waiting.Add(1)
	c.wmu.Lock()
	c.endWrite(c.fr.WriteRSTStream(id, code))
}

func (c *h2conn) writeWindowUpdate(id, n uint32) {
	c.waiting.Add(1)
	c.wmu.Lock()
	c.endWrite(c.fr.WriteWindowUpdate(id, n))
}

func (c *h2conn) writePingAck(data [8]byte) {
	c.waiting.Add(1)
	c.wmu.Lock()
	c.endWrite(c.fr.WritePing(true, data))
}

func (c *h2conn) writeSettingsAck(tableSize uint32, setTable bool) {
	c.waiting.Add(1)
	c.wmu.Lock()
	if setTable {
		c.henc.SetMaxDynamicTableSizeLimit(tableSize)
	}
	c.endWrite(c.fr.WriteSettingsAck())
}

// Close sends GOAWAY, closes the connection, fails pending calls with
// Unavailable and waits for the reader goroutine.
func (c *h2conn) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		if c.err == nil {
			c.err = h2Unavailable("connection closed")
		}
		c.cond.Broadcast()
		c.mu.Unlock()
		// A writer stuck on a peer that does not read must not hold
		// Close up for long.
		_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		c.waiting.Add(1)
		c.wmu.Lock()
		c.endWrite(c.fr.WriteGoAway(0, http2.ErrCodeNo, nil))
		c.nc.Close()
	})
	<-c.readerDone
	return nil
}

// readLoop is the reader goroutine: it dispatches frames until the
// connection fails, then fails every pending call.
func (c *h2conn) readLoop() {
	defer close(c.readerDone)
	err := c.readFrames()

	code := codes.Unavailable
	var pe *h2ProtoError
	if errors.As(err, &pe) {
		code = codes.Internal
		_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		c.waiting.Add(1)
		c.wmu.Lock()
		c.endWrite(c.fr.WriteGoAway(0, pe.code, nil))
	} else if errors.Is(err, io.EOF) {
		err = errors.New("connection closed by server")
	}
	c.mu.Lock()
	failErr := c.err // Close or a write failure came first
	if failErr == nil {
		// Pending calls learn the cause (Internal for a protocol
		// violation); later calls find the connection unavailable.
		failErr = status.Errorf(code, "h2: %v", err)
		c.err = failErr
		if code != codes.Unavailable {
			c.err = h2Unavailable("connection failed: %v", err)
		}
	}
	for _, call := range c.calls {
		call.noRST = true
		c.finishLocked(call, failErr)
	}
	c.cond.Broadcast()
	c.mu.Unlock()
	c.nc.Close()
}

func (c *h2conn) readFrames() error {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.failStream(se.StreamID, h2Internal("stream error: %v", se), se.Code)
				continue
			}
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				msg := fmt.Sprintf("connection error: %v", ce)
				if d := c.fr.ErrorDetail(); d != nil {
					msg += ": " + d.Error()
				}
				return &h2ProtoError{http2.ErrCode(ce), msg}
			}
			if errors.Is(err, http2.ErrFrameTooLarge) {
				return &h2ProtoError{http2.ErrCodeFrameSize, err.Error()}
			}
			return err
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			c.onHeaders(f)
		case *http2.DataFrame:
			c.onData(f)
		case *http2.RSTStreamFrame:
			c.onRST(f)
		case *http2.SettingsFrame:
			err = c.onSettings(f)
		case *http2.WindowUpdateFrame:
			err = c.onWindowUpdate(f)
		case *http2.PingFrame:
			if !f.IsAck() {
				c.writePingAck(f.Data)
			}
		case *http2.GoAwayFrame:
			c.onGoAway(f)
		case *http2.PushPromiseFrame:
			err = &h2ProtoError{http2.ErrCodeProtocol, "PUSH_PROMISE received with push disabled"}
		}
		if err != nil {
			return err
		}
	}
}

// failStream ends stream id's call, if still open, with err and resets the
// stream with code.
func (c *h2conn) failStream(id uint32, err error, code http2.ErrCode) {
	c.mu.Lock()
	call := c.calls[id]
	if call == nil {
		c.mu.Unlock()
		return
	}
	call.noRST = true
	c.finishLocked(call, err)
	c.mu.Unlock()
	c.writeRST(id, code)
}

func (c *h2conn) onHeaders(f *http2.MetaHeadersFrame) {
	var httpStatus, ctype, gStatus, gMessage string
	var hasStatus bool
	for _, hf := range f.Fields {
		switch hf.Name {
		case ":status":
			httpStatus = hf.Value
		case "content-type":
			ctype = hf.Value
		case "grpc-status":
			gStatus, hasStatus = hf.Value, true
		case "grpc-message":
			gMessage = hf.Value
		}
	}
	id, ended := f.StreamID, f.StreamEnded()

	c.mu.Lock()
	call := c.calls[id]
	if call == nil {
		c.mu.Unlock()
		return
	}
	var err error
	switch {
	case f.Truncated:
		err = h2Internal("response header list too large")
	case !call.gotHeaders && httpStatus != "200":
		err = h2Internal("unexpected HTTP status code %q", httpStatus)
	case !call.gotHeaders && !strings.HasPrefix(ctype, "application/grpc"):
		err = h2Internal("unexpected content-type %q", ctype)
	case !call.gotHeaders && !ended:
		call.gotHeaders = true // response headers; DATA and trailers follow
		c.mu.Unlock()
		return
	case !ended:
		err = h2Internal("second HEADERS frame without END_STREAM")
	default: // trailers, or a Trailers-Only response
		err = call.trailerStatus(hasStatus, gStatus, gMessage)
	}
	// If the server ended the stream while the request is still being
	// sent, the caller resets it (noRST stays false). A violation on a
	// stream the server keeps open is reset here.
	if !ended {
		call.noRST = true
	}
	c.finishLocked(call, err)
	c.mu.Unlock()
	if !ended {
		c.writeRST(id, http2.ErrCodeProtocol)
	}
}

// trailerStatus turns the trailers into the call's result.
func (call *h2call) trailerStatus(hasStatus bool, gStatus, gMessage string) error {
	if !hasStatus {
		return h2Internal("server closed the stream without sending grpc-status")
	}
	if gStatus != "0" {
		code, err := strconv.ParseUint(gStatus, 10, 32)
		if err != nil {
			return h2Internal("malformed grpc-status %q", gStatus)
		}
		if code != 0 {
			return status.New(codes.Code(code), decodeGRPCMessage(gMessage)).Err()
		}
	}
	if call.msgHdrN != 0 {
		return h2Internal("response ended inside a message")
	}
	if call.nmsg != 1 {
		return h2Internal("cardinality violation: %d response messages for a unary call", call.nmsg)
	}
	return nil
}

func (c *h2conn) onData(f *http2.DataFrame) {
	n := f.Length // flow control counts padding too
	c.recvUnacked += n
	if c.recvUnacked >= h2RecvUpdate {
		c.writeWindowUpdate(0, c.recvUnacked)
		c.recvUnacked = 0
	}
	id := f.StreamID

	c.mu.Lock()
	call := c.calls[id]
	if call == nil {
		c.mu.Unlock()
		return // cancelled, finished or unknown stream
	}
	var err error
	if !call.gotHeaders {
		err = h2Internal("DATA before response HEADERS")
	} else if err = call.consume(f.Data()); err == nil && f.StreamEnded() {
		err = h2Internal("server closed the stream without sending trailers")
	}
	if err != nil {
		ended := f.StreamEnded()
		call.noRST = true
		c.finishLocked(call, err)
		c.mu.Unlock()
		if !ended {
			c.writeRST(id, http2.ErrCodeProtocol)
		}
		return
	}
	var upd uint32
	if call.recvUnacked += n; call.recvUnacked >= h2RecvUpdate {
		upd, call.recvUnacked = call.recvUnacked, 0
	}
	c.mu.Unlock()
	if upd > 0 {
		c.writeWindowUpdate(id, upd)
	}
}

// consume parses gRPC length-prefixed messages out of DATA payload p,
// appending message bytes to call.buf.
func (call *h2call) consume(p []byte) error {
	for len(p) > 0 {
		if call.msgHdrN < h2GRPCPrefixSize {
			k := copy(call.msgHdr[call.msgHdrN:], p)
			call.msgHdrN += k
			p = p[k:]
			if call.msgHdrN < h2GRPCPrefixSize {
				return nil
			}
			if call.msgHdr[0] != 0 {
				return h2Internal("compressed response message (flag %d) not supported", call.msgHdr[0])
			}
			if call.nmsg++; call.nmsg > 1 {
				return h2Internal("cardinality violation: more than one response message for a unary call")
			}
			call.need = uint32(call.msgHdr[1])<<24 | uint32(call.msgHdr[2])<<16 | uint32(call.msgHdr[3])<<8 | uint32(call.msgHdr[4])
			if call.need == 0 {
				call.msgHdrN = 0
			}
			continue
		}
		k := int(min(uint64(call.need), uint64(len(p))))
		call.buf = append(call.buf, p[:k]...)
		p = p[k:]
		if call.need -= uint32(k); call.need == 0 {
			call.msgHdrN = 0
		}
	}
	return nil
}

func (c *h2conn) onRST(f *http2.RSTStreamFrame) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call := c.calls[f.StreamID]
	if call == nil {
		return
	}
	call.noRST = true
	var err error
	switch {
	case f.ErrCode == http2.ErrCodeRefusedStream:
		err = h2Unavailable("stream refused (RST_STREAM REFUSED_STREAM)")
	case f.ErrCode == http2.ErrCodeCancel && !call.deadline.IsZero() && !time.Now().Before(call.deadline):
		// How grpc-go servers enforce grpc-timeout: RST_STREAM(CANCEL)
		// when it expires, no trailers.
		err = status.Error(codes.DeadlineExceeded, "h2: stream reset (CANCEL) by the server after the grpc-timeout expired")
	default:
		err = h2Internal("stream terminated by RST_STREAM with error code: %v", f.ErrCode)
	}
	c.finishLocked(call, err)
}

func (c *h2conn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	var tableSize uint32
	var setTable bool
	c.mu.Lock()
	for i := range f.NumSettings() {
		s := f.Setting(i)
		if err := s.Valid(); err != nil {
			c.mu.Unlock()
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				return &h2ProtoError{http2.ErrCode(ce), fmt.Sprintf("invalid setting %v", s)}
			}
			return &h2ProtoError{http2.ErrCodeProtocol, fmt.Sprintf("invalid setting %v", s)}
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.initWin
			for _, call := range c.calls {
				call.sendWin += delta
			}
			c.initWin = int64(s.Val)
		case http2.SettingMaxConcurrentStreams:
			c.maxStreams = s.Val
		case http2.SettingMaxFrameSize:
			c.maxFrame = s.Val
		case http2.SettingHeaderTableSize:
			tableSize, setTable = s.Val, true
		}
	}
	if c.condWaiters > 0 {
		c.cond.Broadcast()
	}
	c.mu.Unlock()
	c.writeSettingsAck(tableSize, setTable)
	return nil
}

func (c *h2conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	if f.StreamID == 0 {
		c.connWin += int64(f.Increment)
		if c.connWin > h2MaxWindow {
			c.mu.Unlock()
			return &h2ProtoError{http2.ErrCodeFlowControl, "connection send window overflow"}
		}
	} else if call := c.calls[f.StreamID]; call != nil {
		call.sendWin += int64(f.Increment)
		if call.sendWin > h2MaxWindow {
			c.mu.Unlock()
			c.failStream(f.StreamID, h2Internal("stream send window overflow"), http2.ErrCodeFlowControl)
			return nil
		}
	}
	if c.condWaiters > 0 {
		c.cond.Broadcast()
	}
	c.mu.Unlock()
	return nil
}

func (c *h2conn) onGoAway(f *http2.GoAwayFrame) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.goaway = true
	for id, call := range c.calls {
		if id > f.LastStreamID {
			call.noRST = true
			c.finishLocked(call, h2Unavailable("stream not processed: GOAWAY received (code %v, last stream %d, %q)",
				f.ErrCode, f.LastStreamID, f.DebugData()))
		}
	}
	c.cond.Broadcast()
}

// encodeGRPCTimeout formats a grpc-timeout value as grpc-go does: the
// finest unit whose (rounded-up) value has at most 8 digits.
func encodeGRPCTimeout(t time.Duration) string {
	const maxValue = 1e8 - 1
	if t <= 0 {
		return "0n"
	}
	div := func(d, r time.Duration) int64 {
		if d%r > 0 {
			return int64(d/r + 1)
		}
		return int64(d / r)
	}
	for _, u := range [...]struct {
		d time.Duration
		s string
	}{{time.Nanosecond, "n"}, {time.Microsecond, "u"}, {time.Millisecond, "m"}, {time.Second, "S"}, {time.Minute, "M"}} {
		if v := div(t, u.d); v <= maxValue {
			return strconv.FormatInt(v, 10) + u.s
		}
	}
	return strconv.FormatInt(div(t, time.Hour), 10) + "H"
}

// decodeGRPCMessage undoes grpc-message percent-encoding as grpc-go does:
// "%XX" with two hex digits becomes that byte, anything else stays.
func decodeGRPCMessage(msg string) string {
	i := strings.IndexByte(msg, '%')
	if i < 0 {
		return msg
	}
	var sb strings.Builder
	sb.Grow(len(msg))
	sb.WriteString(msg[:i])
	for ; i < len(msg); i++ {
		ch := msg[i]
		if ch == '%' && i+2 < len(msg) {
			if v, err := strconv.ParseUint(msg[i+1:i+3], 16, 8); err == nil {
				sb.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		sb.WriteByte(ch)
	}
	return sb.String()
}
