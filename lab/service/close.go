package service

import (
	"context"
	"time"

	"github.com/cockroachdb/errors"
)

// CloseBound bounds each close of a command on its way out (CloseWithin).
const CloseBound = 20 * time.Second

// CloseWithin runs a Close that takes a context, bounded by CloseBound for
// a command that is exiting, and adds its error to *err, naming what:
// a failed Close fails the command. A command cut by a second signal (Cut)
// does not wait for it: the close goes on in the background until the
// process exits, and the error says it was abandoned.
func CloseWithin(what string, close func(context.Context) error, err *error) {
	ctx, cancel := context.WithTimeout(Cut(), CloseBound)
	defer cancel()
	if cerr := close(ctx); cerr != nil {
		if Cut().Err() != nil {
			cerr = errors.Newf("abandoned: %v", context.Cause(Cut()))
		}
		*err = errors.CombineErrors(*err, errors.Wrapf(cerr, "close %s", what))
	}
}
