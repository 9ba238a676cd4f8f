//! A small `metrics` recorder for tests: counters and gauges readable at
//! any time, histograms as a count of recorded values.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

#[derive(Default)]
struct Count(AtomicU64);

impl HistogramFn for Count {
    fn record(&self, _: f64) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Default, Clone)]
pub struct TestRecorder {
    counters: Arc<Mutex<HashMap<Key, Arc<AtomicU64>>>>,
    gauges: Arc<Mutex<HashMap<Key, Arc<AtomicU64>>>>,
    histograms: Arc<Mutex<HashMap<Key, Arc<Count>>>>,
}

fn matches(k: &Key, name: &str, op: Option<&str>) -> bool {
    k.name() == name && op.is_none_or(|op| k.labels().any(|l| l.key() == "op" && l.value() == op))
}

impl TestRecorder {
    /// A counter's value (the first registered key matching).
    pub fn counter(&self, name: &str, op: Option<&str>) -> Option<u64> {
        let m = self.counters.lock().unwrap();
        m.iter()
            .find(|(k, _)| matches(k, name, op))
            .map(|(_, v)| v.load(Ordering::Relaxed))
    }

    pub fn gauge(&self, name: &str, op: Option<&str>) -> Option<f64> {
        let m = self.gauges.lock().unwrap();
        m.iter()
            .find(|(k, _)| matches(k, name, op))
            .map(|(_, v)| f64::from_bits(v.load(Ordering::Relaxed)))
    }

    /// How many values a histogram recorded.
    pub fn recorded(&self, name: &str, op: Option<&str>) -> Option<u64> {
        let m = self.histograms.lock().unwrap();
        m.iter()
            .find(|(k, _)| matches(k, name, op))
            .map(|(_, v)| v.0.load(Ordering::Relaxed))
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(
            self.counters
                .lock()
                .unwrap()
                .entry(key.clone())
                .or_default()
                .clone(),
        )
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(
            self.gauges
                .lock()
                .unwrap()
                .entry(key.clone())
                .or_default()
                .clone(),
        )
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(
            self.histograms
                .lock()
                .unwrap()
                .entry(key.clone())
                .or_default()
                .clone(),
        )
    }
}
