//! Doubt horizon sampling (Gryphon, paper 002 equation 5): each inbound stream's progress in the
//! sender's clock, smoothed; PDCC's answers and SDCC's NACK windows read it.

use crate::time::Time;

use super::RegionState;

impl RegionState {
    /// Samples the doubt horizon rate of every inbound stream. True if some stream's NACK
    /// window may have changed (the region's part of the gauges then needs a refresh).
    pub(crate) fn sample_doubt_rates(
        &mut self,
        now: Time,
        alpha: f64,
        queue_delay_history: usize,
    ) -> bool {
        let mut windows_changed = false;
        for stream in self.inbound.values_mut() {
            windows_changed |= stream.sample_doubt_rate(now, alpha, queue_delay_history);
        }
        windows_changed
    }
}
