//! The little executor the blocking driver needs: run one future on the
//! current thread, parking it while the future waits.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `f` to completion on this thread.
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// Which of the futures given to [`first_of`] completed.
pub(crate) type Which = usize;

/// Completes with the index of the first of `futs` to complete.
pub(crate) async fn first_of(
    futs: &mut [std::pin::Pin<&mut (dyn Future<Output = ()> + Send)>],
) -> Which {
    std::future::poll_fn(|cx| {
        for (i, f) in futs.iter_mut().enumerate() {
            if f.as_mut().poll(cx).is_ready() {
                return Poll::Ready(i);
            }
        }
        Poll::Pending
    })
    .await
}
