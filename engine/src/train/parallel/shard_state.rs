//! A multi-device run's state seen whole: the optimizer state gathered from the
//! ranks' shards for a checkpoint (or, over MPI, each rank's own shard for it to write),
//! a checkpoint's state placed back on any number of ranks, and rank 0's weights shared
//! with the others after a restore.
//!
//! May call: `error`, `kernels`, `memory`, `optim`, `parallel`, `runtime`, `tensor`,
//! `train::{checkpoint, parallel::join, trainer, world, zero3}`. Called by:
//! `train::state`.

use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::blockwise::BLOCK;
use crate::memory::Category;
use crate::optim::{Optimizer, StateHost};
use crate::parallel::{Collective, Comm};
use crate::runtime::Runtime;
use crate::tensor::Tensor;
use crate::train::checkpoint::HostTensor;
use crate::train::checkpoint::ranks::SaveRanks;
use crate::train::parallel::join::gather_bytes;
use crate::train::trainer::Trainer;

/// The ranks of a save over MPI, exchanging through the run's communicator.
pub(in crate::train) struct CommRanks<'a>(&'a Comm);

impl SaveRanks for CommRanks<'_> {
    fn rank(&self) -> usize {
        self.0.rank()
    }

    fn size(&self) -> usize {
        self.0.world()
    }

    fn gather(&self, mine: &str) -> Result<Vec<String>, String> {
        let all = gather_bytes(self.0, mine.as_bytes()).map_err(|e| e.to_string())?;
        Ok(all.into_iter().map(|b| String::from_utf8_lossy(&b).into_owned()).collect())
    }
}

impl Trainer {
    /// Parameter `i`'s optimizer state on the host, whole (gathered from the ranks'
    /// shards above stage 0).
    pub(in crate::train) fn optimizer_state_host(&self, i: usize) -> Result<Option<StateHost>, Error> {
        let adam = self.opt.rule.is_adam();
        let state = self.local_optimizer_state(i)?;
        // Over MPI, every process's ranks' pieces (every rank makes this call), each
        // rank's shard in rank order; a rank without the state sends nothing.
        let Some(w) = self
            .world
            .as_ref()
            .filter(|w| w.comms.len() < w.size && (w.zero > 0 || !w.offload.is_empty()))
        else {
            return Ok(state);
        };
        let comm = &w.comms[0];
        let gather = |mine: Vec<f32>| -> Result<Vec<f32>, Error> {
            let all = comm
                .all_gather(mine)
                .map_err(|e| Error::invalid("checkpoint all-gather", e.to_string()))?;
            Ok(all.iter().flat_map(|v| v.iter().copied()).collect())
        };
        let (m, v, absmax) = state.map_or((Vec::new(), None, None), |s| (s.m, s.v, s.absmax));
        let m_all = gather(m)?;
        let v_all = if adam { Some(gather(v.unwrap_or_default())?) } else { None };
        // 8-bit state: every rank's blocks, in rank order (its shards cut at blocks).
        let quantized = absmax.is_some();
        let (am, av) = absmax.unwrap_or_default();
        let (am, av) = (gather(am)?, gather(av)?);
        Ok((!m_all.is_empty()).then_some(StateHost {
            m: m_all,
            v: v_all,
            absmax: (quantized && !am.is_empty()).then_some((am, av)),
        }))
    }

    /// Over MPI with the optimizer's state sharded (ZeRO 1-3 or offloaded): the ranks
    /// a checkpoint is saved by, each writing its own shard.
    pub(in crate::train) fn save_ranks(&self) -> Option<CommRanks<'_>> {
        self.world
            .as_ref()
            .filter(|w| w.comms.len() < w.size && (w.zero > 0 || !w.offload.is_empty()))
            .map(|w| CommRanks(&w.comms[0]))
    }

    /// This process's shard of the optimizer's state, flat tensors by state name (a
    /// parameter this rank owns nothing of is left out).
    pub(in crate::train) fn optimizer_shard(&self) -> Result<Vec<HostTensor>, Error> {
        let mut out = Vec::new();
        for (i, p) in self.params.list.iter().enumerate() {
            let Some(StateHost { m, v, absmax }) = self.local_optimizer_state(i)? else {
                continue;
            };
            let names = self.opt.state_names(&p.name);
            let absmax = absmax.map(|(am, av)| [(format!("{}.absmax", names[0]), am), (format!("{}.absmax", names[1]), av)]);
            let moments = std::iter::once((names[0].clone(), m)).chain(v.map(|v| (names[1].clone(), v)));
            for (name, data) in moments.chain(absmax.into_iter().flatten()) {
                if !data.is_empty() {
                    out.push(HostTensor {
                        name,
                        shape: vec![data.len()],
                        data,
                    });
                }
            }
        }
        Ok(out)
    }

    /// [`Trainer::optimizer_state_host`] over this process's ranks only (8-bit state: its
    /// values, and the ranks' block absmax values in rank order).
    fn local_optimizer_state(&self, i: usize) -> Result<Option<StateHost>, Error> {
        let adam = self.opt.rule.is_adam();
        if let Some(w) = self.world.as_ref().filter(|w| !w.offload.is_empty()) {
            let (mut m_all, mut v_all, mut any) = (Vec::new(), Vec::new(), false);
            let mut absmax: Option<(Vec<f32>, Vec<f32>)> = None;
            for host in &w.offload {
                if let Some(Some((m, v))) = host.state.get(i) {
                    any = true;
                    m_all.extend_from_slice(m);
                    v_all.extend_from_slice(v);
                }
                // 8-bit moments: their values, and the ranks' blocks in rank order.
                if let Some(Some(q)) = host.quantized.get(i) {
                    any = true;
                    let (m, v) = q.values();
                    m_all.extend(m);
                    v_all.extend(v);
                    let all = absmax.get_or_insert_with(Default::default);
                    all.0.extend_from_slice(&q.m.1);
                    all.1.extend_from_slice(&q.v.1);
                }
            }
            return Ok(any.then_some(StateHost {
                m: m_all,
                v: adam.then_some(v_all),
                absmax,
            }));
        }
        let numel = self.param_shape(i).iter().product::<usize>();
        let Some(w) = self.world.as_ref().filter(|w| w.zero > 0) else {
            return self.opt.state_host(&self.rt, i, numel);
        };
        let sources = std::iter::once((&*self.rt, &self.opt)).chain(w.peers.iter().map(|p| (&*p.rt, &p.opt)));
        let (mut m_all, mut v_all, mut any) = (Vec::new(), Vec::new(), false);
        let mut absmax: Option<(Vec<f32>, Vec<f32>)> = None;
        for (k, (rt, opt)) in sources.enumerate() {
            let len = w.shards.range(i, w.base_rank + k).len();
            if let Some(s) = opt.state_host(rt, i, len)? {
                any = true;
                m_all.extend(s.m);
                v_all.extend(s.v.unwrap_or_default());
                // 8-bit state: the ranks' blocks in rank order are the parameter's.
                if let Some((am, av)) = s.absmax {
                    let all = absmax.get_or_insert_with(Default::default);
                    all.0.extend(am);
                    all.1.extend(av);
                }
            }
        }
        Ok(any.then_some(StateHost {
            m: m_all,
            v: adam.then_some(v_all),
            absmax,
        }))
    }

    /// Installs parameter `i`'s whole optimizer state on every rank (each rank's shard
    /// of it above stage 0).
    pub(in crate::train) fn place_optimizer_state(&mut self, i: usize, state: &StateHost) -> Result<(), Error> {
        let (m, v) = (&state.m, state.v.as_deref());
        let p = &self.params.list[i];
        let name = p.name.clone();
        let shape = p.value.shape().to_vec();
        let zero = self.world.as_ref().map_or(0, |w| w.zero);
        let shards = self.shards();
        let quantized = self.opt.rule.quantizes(m.len());
        if let Some(w) = self.world.as_mut().filter(|w| !w.offload.is_empty()) {
            for (k, host) in w.offload.iter_mut().enumerate() {
                let r = shards.range(i, w.base_rank + k);
                if host.state.len() <= i {
                    host.state.resize_with(i + 1, || None);
                }
                if host.quantized.len() <= i {
                    host.quantized.resize_with(i + 1, || None);
                }
                host.state[i] = None;
                host.quantized[i] = None;
                if r.is_empty() {
                    continue;
                }
                if quantized {
                    // This shard's blocks of the saved absmax (its cuts are at blocks).
                    let blocks = r.start / BLOCK..r.end.div_ceil(BLOCK);
                    let absmax = state
                        .absmax
                        .as_ref()
                        .filter(|(am, av)| am.len() >= blocks.end && av.len() >= blocks.end)
                        .map(|(am, av)| (&am[blocks.clone()], &av[blocks.clone()]));
                    let zeros = vec![0.0; r.len()];
                    let vs = v.map_or(&zeros[..], |v| &v[r.clone()]);
                    host.quantized[i] = Some(crate::optim::HostQuant::from_values(&m[r.clone()], vs, absmax));
                } else {
                    host.state[i] = Some((m[r.clone()].to_vec(), v.map(|v| v[r].to_vec()).unwrap_or_default()));
                }
            }
            return Ok(());
        }
        let mut targets: Vec<(&Runtime, &mut Optimizer)> = vec![(&self.rt, &mut self.opt)];
        let base = self.world.as_ref().map_or(0, |w| w.base_rank);
        if let Some(w) = &mut self.world {
            targets.extend(w.peers.iter_mut().map(|p| (&*p.rt, &mut p.opt)));
        }
        for (k, (rt, opt)) in targets.into_iter().enumerate() {
            if zero == 0 {
                opt.place_state(rt, i, &name, &shape, state)?;
                continue;
            }
            let r = shards.range(i, base + k);
            if r.is_empty() {
                if opt.state.len() > i {
                    opt.state[i] = None;
                }
                continue;
            }
            // 8-bit state: this shard's blocks of the saved absmax (its cuts are at blocks).
            let blocks = r.start / BLOCK..r.end.div_ceil(BLOCK);
            let shard = StateHost {
                m: m[r.clone()].to_vec(),
                v: v.map(|v| v[r.clone()].to_vec()),
                absmax: state
                    .absmax
                    .as_ref()
                    .filter(|(am, av)| am.len() >= blocks.end && av.len() >= blocks.end)
                    .map(|(am, av)| (am[blocks.clone()].to_vec(), av[blocks.clone()].to_vec())),
            };
            opt.place_state(rt, i, &name, &[r.len()], &shard)?;
        }
        Ok(())
    }

    /// Gives every rank rank 0's weights and optimizer step count (after a restore).
    pub(in crate::train) fn share_weights(&mut self) -> Result<(), Error> {
        if self.sharded_weights() {
            self.shard_weights()?;
        }
        let sharded = self.sharded_weights();
        let Some(w) = &mut self.world else { return Ok(()) };
        for (i, p) in self.params.list.iter().enumerate().filter(|_| !sharded) {
            let host = p.value.to_f32_vec(&self.rt)?;
            for peer in &mut w.peers {
                let q = &mut peer.params.list[i];
                q.value = Tensor::from_f32(&peer.rt, &host, p.value.shape(), Category::Parameter, &p.name)?;
            }
        }
        // Buffers whole on every device.
        for b in &self.params.buffers {
            let host = b.value.to_f32_vec(&self.rt)?;
            for peer in &mut w.peers {
                let i = peer
                    .params
                    .find_buffer(&b.name)
                    .ok_or_else(|| Error::invalid("buffers", format!("a device lacks {}", b.name)))?;
                peer.params.buffers[i].value = Tensor::from_f32(&peer.rt, &host, b.value.shape(), Category::Parameter, &b.name)?;
            }
        }
        w.offload.iter_mut().for_each(|h| h.state.clear());
        for peer in &mut w.peers {
            peer.opt.step = self.opt.step;
            peer.opt.state = (0..peer.params.list.len()).map(|_| None).collect();
        }
        Ok(())
    }
}
