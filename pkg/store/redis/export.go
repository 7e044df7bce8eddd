package redisstore

import "context"

// Classify marks err, the error of a Redis command made under ctx by a
// client other than the Store's (package store/upstream's), as the Store
// marks its own (see errors.go): an outage wraps store.ErrUnavailable, an
// unusable answer store.ErrProtocol, a refusal of rls's credentials
// store.ErrAuth; the caller's cancellation is returned as it is, and nil
// as nil. op names the operation in the message.
func Classify(ctx context.Context, op string, err error) error {
	return new(Store).fail(ctx, op, budget{caller: true}, err)
}
