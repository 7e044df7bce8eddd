package connguard

// frameScanner follows the HTTP/2 frames written by a server (no preface:
// the server's side starts with a frame) across Write calls, and counts
// the RST_STREAM frames with error code REFUSED_STREAM. It reads the
// 9-byte frame headers and skips payloads, except an RST_STREAM's 4-byte
// error code.
type frameScanner struct {
	hdr  [9]byte
	nhdr int    // bytes of hdr seen; 9 once in the payload
	left uint32 // payload bytes still to come
	rst  bool   // the payload is an RST_STREAM's error code
	code uint32
}

const (
	frameHeaderLen   = 9   // length (3 bytes), type, flags, stream id (4)
	frameRSTStream   = 0x3 // type of RST_STREAM
	rstStreamPayload = 4   // its payload: the error code
	errCodeRefused   = 0x7 // REFUSED_STREAM
)

// scan reads p, the next bytes written, and returns the refused streams
// whose RST_STREAM frame ended in it.
func (f *frameScanner) scan(p []byte) (refused int) {
	for len(p) > 0 {
		if f.nhdr < frameHeaderLen {
			var ok bool
			if p, ok = f.header(p); !ok {
				return refused
			}
		}
		n := min(f.left, uint32(len(p)))
		if f.rst {
			for _, b := range p[:n] {
				f.code = f.code<<8 | uint32(b)
			}
		}
		p = p[n:]
		f.left -= n
		if f.left == 0 {
			if f.rst && f.code == errCodeRefused {
				refused++
			}
			f.nhdr = 0
		}
	}
	return refused
}

// header reads the rest of a frame header from p and returns what follows
// it; ok is false when p ended first.
func (f *frameScanner) header(p []byte) (rest []byte, ok bool) {
	var h []byte
	if f.nhdr == 0 && len(p) >= frameHeaderLen {
		h, p = p[:frameHeaderLen], p[frameHeaderLen:] // the whole header here: no copy
	} else {
		n := copy(f.hdr[f.nhdr:], p)
		f.nhdr += n
		p = p[n:]
		if f.nhdr < frameHeaderLen {
			return p, false
		}
		h = f.hdr[:]
	}
	f.nhdr = frameHeaderLen
	f.left = uint32(h[0])<<16 | uint32(h[1])<<8 | uint32(h[2])
	f.rst = h[3] == frameRSTStream && f.left == rstStreamPayload
	f.code = 0
	return p, true
}
