//! Prefix-cache fills, off the requests' path.
//!
//! A request routed before its prompt was tokenized whole leaves the rest
//! of its text (`tokenize::Rest`). Encoding that into the tokenizer's
//! prefix cache is for a later request (the next turn of a conversation
//! resends the text), not for this one, so it runs on threads of the least
//! priority, one per CPU, on the CPU time the requests in flight leave
//! over. A fill that finds the queue full is dropped: a later turn then
//! encodes the text itself, as without the cache.
use std::sync::Arc;

use crate::tokenize::{ModelTokenizer, Rest};

type Job = (Arc<ModelTokenizer>, Rest);

/// The fill queue and its threads (they end when it is dropped).
pub(crate) struct Fills {
    tx: crossbeam_channel::Sender<Job>,
    /// Keeps the queue open when no thread could start (then it fills up
    /// and further fills are dropped).
    _rx: crossbeam_channel::Receiver<Job>,
}

impl Fills {
    /// `threads` background threads behind a queue of `queue` fills.
    pub(crate) fn new(threads: usize, queue: usize) -> Self {
        let (tx, rx) = crossbeam_channel::bounded::<Job>(queue);
        for i in 0..threads {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("kvr-fill-{i}"))
                .spawn(move || {
                    crate::sys::lower_thread_priority();
                    for (tok, rest) in rx {
                        if let Err(e) = tok.finish(&mut Vec::new(), &rest) {
                            tracing::debug!(error = %e, "tokenizer cache fill failed");
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no tokenizer cache fill thread");
            }
        }
        Self { tx, _rx: rx }
    }

    /// Queues the encoding of `rest` into `tok`'s cache; false (dropped)
    /// when the queue is full.
    pub(crate) fn offer(&self, tok: Arc<ModelTokenizer>, rest: Rest) -> bool {
        self.tx.try_send((tok, rest)).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::Endpoint;
    use serde_json::json;

    #[test]
    fn a_fill_puts_the_rest_in_the_cache_and_a_full_queue_drops() {
        let tok = Arc::new(ModelTokenizer::builtin().with_prefix_cache(1 << 20));
        let text = "abcdefgh".repeat(1000);
        let body = json!({"prompt": text});
        let part = |t: &ModelTokenizer| {
            t.prompt_tokens_until(Endpoint::Completions, &body, |_| false)
                .unwrap()
        };
        let p = part(&tok);
        assert_eq!(p.tokens.len(), 0);
        let fills = Fills::new(1, 1);
        assert!(fills.offer(Arc::clone(&tok), p.rest.unwrap()));
        let t0 = std::time::Instant::now();
        while tok.prefix_cache_stats().unwrap().encoded_tokens < 8000 {
            assert!(t0.elapsed().as_secs() < 10, "no fill");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // Filled: the same prompt now comes from the cache up to its last
        // chunk before it is asked whether it wants more.
        let again = part(&tok);
        assert!(
            again.tokens.len() >= 8000 - 1024 - 1,
            "{}",
            again.tokens.len()
        );
        // No thread, a queue of one: the second waits for room, dropped.
        let stuck = Fills::new(0, 1);
        let fresh = ModelTokenizer::builtin().with_prefix_cache(1 << 20);
        assert!(stuck.offer(Arc::clone(&tok), part(&fresh).rest.unwrap()));
        assert!(!stuck.offer(tok, part(&fresh).rest.unwrap()));
    }
}
