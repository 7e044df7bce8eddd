package limiter

import (
	"context"
	"sync"
)

// background is the limiter's work off the request path (write-backs,
// refund retries), each in a goroutine it joins. stop ends the retries'
// waits (each makes one last try); work, the store calls' context, ends
// with Close's, so nothing runs once Close returns.
type background struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup

	stop       context.Context // done once Close begins
	stopNow    context.CancelFunc
	work       context.Context // done once Close gives up waiting
	cancelWork context.CancelFunc
}

func (b *background) init() {
	b.stop, b.stopNow = context.WithCancel(context.Background())
	b.work, b.cancelWork = context.WithCancel(context.Background())
}

// start runs f in a goroutine joined by Close, and reports false (f does
// not run) once Close has begun.
func (b *background) start(f func()) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
	return true
}

// close refuses new work, ends the backoff waits, and waits for the
// goroutines to return; when ctx ends first it cancels their store calls
// and waits for them to return (a store honours its context), then returns
// ctx's error.
func (b *background) close(ctx context.Context) error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.stopNow()
	done := make(chan struct{})
	go func() {
		b.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		b.cancelWork()
		return nil
	case <-ctx.Done():
		b.cancelWork()
		<-done
		return ctx.Err()
	}
}
