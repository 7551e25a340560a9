//! A metric family whose series are encoded in the order of their labels, so that every scrape
//! lists them the same way (`prometheus-client`'s `Family` keeps them in a hash map, and its order
//! changes from one scrape to the next).

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, RwLock},
};

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder},
    metrics::{MetricType, TypedMetric},
};

/// Series of metric `M`, one per label set `S`, encoded in label order. Clones share the series.
pub struct Sorted<S, M> {
    series: Arc<RwLock<BTreeMap<S, M>>>,
}

impl<S, M> Clone for Sorted<S, M> {
    fn clone(&self) -> Self {
        Sorted {
            series: self.series.clone(),
        }
    }
}

impl<S, M> Default for Sorted<S, M> {
    fn default() -> Self {
        Sorted {
            series: Arc::new(RwLock::new(BTreeMap::new())),
        }
    }
}

impl<S: fmt::Debug, M: fmt::Debug> fmt::Debug for Sorted<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.series.read().unwrap_or_else(|p| p.into_inner()).iter())
            .finish()
    }
}

impl<S: Ord + Clone, M: Default + Clone> Sorted<S, M> {
    /// The series of `labels`, created (at zero) when it is the first ask; a handle that shares
    /// the series (counters and gauges are shared handles).
    pub fn get_or_create(&self, labels: &S) -> M {
        if let Some(m) = self
            .series
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(labels)
        {
            return m.clone();
        }
        self.series
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(labels.clone())
            .or_default()
            .clone()
    }

    /// Removes the series of `labels` (a member a reload removed); whether there was one.
    pub fn remove(&self, labels: &S) -> bool {
        self.series
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(labels)
            .is_some()
    }
}

impl<S, M> EncodeMetric for Sorted<S, M>
where
    S: Ord + EncodeLabelSet,
    M: EncodeMetric + TypedMetric,
{
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let series = self.series.read().unwrap_or_else(|p| p.into_inner());
        for (labels, m) in series.iter() {
            m.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }

    fn is_empty(&self) -> bool {
        self.series
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }
}

impl<S, M: TypedMetric> TypedMetric for Sorted<S, M> {
    const TYPE: MetricType = M::TYPE;
}

#[cfg(test)]
mod tests {
    use prometheus_client::{
        encoding::EncodeLabelSet, metrics::counter::Counter, registry::Registry,
    };

    use super::*;

    #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
    struct L {
        name: String,
    }

    #[test]
    fn series_are_encoded_in_label_order_and_handles_share_them() {
        let fam: Sorted<L, Counter> = Sorted::default();
        for name in ["c", "a", "b"] {
            fam.get_or_create(&L { name: name.into() }).inc();
        }
        fam.get_or_create(&L { name: "a".into() }).inc();
        let mut r = Registry::default();
        r.register("x", "X", fam.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            samples,
            [
                "x_total{name=\"a\"} 2",
                "x_total{name=\"b\"} 1",
                "x_total{name=\"c\"} 1"
            ]
        );
        assert!(fam.remove(&L { name: "b".into() }));
        assert!(!fam.remove(&L { name: "b".into() }));
    }
}
