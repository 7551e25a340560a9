//! Loads the eBPF object, attaches it to an interface and pins the link and maps, replaces the
//! program of an existing attachment through its pinned link, and detaches.
//!
//! Replacing goes through `bpf_link_update` on the pinned link: the link id stays the same and the
//! device never runs without a program (no detach-then-attach, which would bounce a native-XDP
//! device). The maps are pinned by name, so a replacement program adopts the existing counters,
//! policies and services.

use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfError, EbpfLoader,
    pin::PinError,
    programs::{
        LinkOrder, ProgramError, SchedClassifier, TcAttachType, TestRun, TestRunOptions, Xdp,
        XdpMode,
        links::{FdLink, LinkError, PinnedLink},
        tc::{SchedClassifierLink, TcAttachOptions},
        xdp::XdpLink,
    },
};
use gateway_common::{
    maps::{AttachMode, FINISHER_ATTACHED, FINISHER_SENDS_REPLIES, names},
    programs::{self, Hook, Jump},
};
use serde::Serialize;
use thiserror::Error;

use crate::{
    EBPF_OBJECT,
    caps::{self, CapsError, Need},
    datapath::carry::{self, Carried, Carry, CarryError},
    datapath::ethtool,
    datapath::layouts::{self, LayoutsError},
    datapath::maps::{self, MapsError},
    datapath::mode::ModeRequest,
    datapath::pins::{self, PinDir, PinsError},
    datapath::rekey::{Moved, Moving, RekeyError},
};

/// Errors of loading, attaching and detaching.
#[derive(Debug, Error)]
pub enum LoaderError {
    /// No such network interface.
    #[error("unknown interface '{0}'")]
    UnknownInterface(String),
    /// A capability is missing.
    #[error(transparent)]
    Caps(#[from] CapsError),
    /// The pin directory is unusable.
    #[error(transparent)]
    Pins(#[from] PinsError),
    /// The interface is attached in another mode; changing it needs a detach.
    #[error(
        "interface '{iface}' is attached in {attached} mode; `gateway detach --iface {iface}` first to change to {requested}"
    )]
    ModeMismatch {
        /// Interface name.
        iface: String,
        /// Mode in use.
        attached: &'static str,
        /// Mode asked for.
        requested: &'static str,
    },
    /// The object could not be loaded.
    #[error("loading the eBPF object: {0}")]
    Load(#[from] EbpfError),
    /// A program could not be loaded or attached (with the causes aya keeps beneath its own
    /// words, the kernel's errno among them).
    #[error("{what}: {}", with_causes(source))]
    Program {
        /// What was being done.
        what: String,
        /// The error.
        source: ProgramError,
    },
    /// The pinned link could not be used.
    #[error("pinned link: {0}")]
    Link(#[from] LinkError),
    /// The link could not be pinned.
    #[error("pinning the link: {0}")]
    Pin(#[from] PinError),
    /// Map access failed.
    #[error(transparent)]
    Maps(#[from] MapsError),
    /// A map could not be carried over to this build's layout.
    #[error(transparent)]
    Carry(#[from] CarryError),
    /// A map's entries could not be moved to where this build keeps them.
    #[error(transparent)]
    Rekey(#[from] RekeyError),
    /// The object's kfunc calls could not be resolved.
    #[error(transparent)]
    Kfunc(#[from] crate::datapath::kfunc::KfuncError),
    /// The layout record could not be written.
    #[error(transparent)]
    Layouts(#[from] LayoutsError),
    /// XDP was asked for on a kernel that refuses XDP programs frame metadata.
    #[error(
        "interface '{iface}': {requested} XDP needs `bpf_xdp_adjust_meta` (XDP hands frames to its TC finishing program in their metadata), which this kernel refuses XDP programs; attach with mode tc, or auto, which picks tc here"
    )]
    NoXdpMetadata {
        /// Interface name.
        iface: String,
        /// Mode asked for.
        requested: &'static str,
    },
}

impl LoaderError {
    /// Whether the error is the caller's input (exit code 2) rather than a system failure.
    pub fn is_input_error(&self) -> bool {
        match self {
            LoaderError::UnknownInterface(_)
            | LoaderError::Caps(_)
            | LoaderError::ModeMismatch { .. }
            | LoaderError::NoXdpMetadata { .. } => true,
            LoaderError::Pins(p) => !matches!(p, PinsError::Io { .. }),
            LoaderError::Carry(c) => matches!(c, CarryError::MapType { .. }),
            _ => false,
        }
    }
}

/// `e` and each error beneath it, `: `-joined (aya's `bpf_link_create failed` says the errno
/// only in its source).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    // Bounded: error chains are a few deep.
    for _ in 0..8 {
        let Some(cause) = next else { break };
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        next = cause.source();
    }
    text
}

fn program_err(what: impl Into<String>) -> impl FnOnce(ProgramError) -> LoaderError {
    let what = what.into();
    move |source| LoaderError::Program { what, source }
}

/// What to attach, where.
#[derive(Clone, Debug)]
pub struct AttachOptions {
    /// Interface name.
    pub iface: String,
    /// Hook to use.
    pub mode: ModeRequest,
    /// bpffs root of the pin directories.
    pub root: PathBuf,
    /// aya-log level compiled into the loaded program (0 off, 1 error ... 5 trace).
    pub ebpf_log_level: u8,
    /// Entries of the issued-keys table when it is created (a pinned one keeps its size).
    pub issued_keys: u32,
}

/// The result of an attach.
pub struct AttachOutcome {
    /// Interface name.
    pub iface: String,
    /// Hook in use.
    pub mode: AttachMode,
    /// Kernel id of the (pinned) link.
    pub link_id: u32,
    /// Kernel id of the program now running.
    pub program_id: u32,
    /// Whether an existing attachment's program was replaced through its link.
    pub replaced: bool,
    /// Why native XDP was refused, when `auto` fell back to generic XDP.
    pub fallback_reason: Option<String>,
    /// The maps a replacement carried over to this build's layout (`crate::datapath::carry`).
    pub carried: Vec<Carried>,
    /// The maps whose carry-over an earlier start left unfinished (stopped between the switch
    /// and the rename), finished by this one (`crate::datapath::carry::recover`).
    pub finished: Vec<&'static str>,
    /// The entries an older build kept in another map, moved to this build's (`crate::datapath::rekey`).
    pub moved: Vec<Moved>,
    /// The loaded object (its maps are pinned; keep it for aya-log).
    pub ebpf: Ebpf,
}

/// Resolves an interface name to its index.
pub fn ifindex(iface: &str) -> Result<u32, LoaderError> {
    nix::net::if_::if_nametoindex(iface).map_err(|_| LoaderError::UnknownInterface(iface.into()))
}

/// Attaches the datapath to `opts.iface`, or replaces the program of an existing attachment.
///
/// On failure nothing new is left behind: a pin directory this call created is removed again.
pub fn attach(opts: &AttachOptions) -> Result<AttachOutcome, LoaderError> {
    let ifindex = ifindex(&opts.iface)?;
    caps::require(Need::Attach)?;
    pins::check_bpffs(&opts.root)?;
    let pd = PinDir::new(&opts.root, &opts.iface);
    if pd.is_attached() {
        return replace(&pd, opts);
    }
    if let Some(other) = pins::other_attachments(&opts.root, &opts.iface, ifindex).first() {
        return Err(PinsError::Stacked {
            iface: opts.iface.clone(),
            other: other.dir.display().to_string(),
            root: other
                .dir
                .parent()
                .map_or_else(String::new, |r| r.display().to_string()),
            owner: other
                .holder()
                .map_or_else(String::new, |pid| format!(", served by pid {pid}")),
        }
        .into());
    }
    pd.create()?;
    // Nothing was attached here (no link pinned): what a failed attach pinned goes, and what
    // was there before (a map another version left, say) stays as it was.
    let before = pd.entries();
    fresh(&pd, ifindex, opts, EBPF_OBJECT).inspect_err(|_| pd.remove_new(&before))
}

/// [`attach`] of another build of the object (`object`: an older release's, say) to an
/// interface nothing is attached to yet: for tests that upgrade a datapath pinned by it.
pub fn attach_object(opts: &AttachOptions, object: &[u8]) -> Result<AttachOutcome, LoaderError> {
    let ifindex = ifindex(&opts.iface)?;
    caps::require(Need::Attach)?;
    let pd = PinDir::new(&opts.root, &opts.iface);
    if pd.is_attached() {
        return Err(PinsError::Ambiguous(format!(
            "interface '{}' is attached already: another build is attached only afresh",
            opts.iface
        ))
        .into());
    }
    pd.create()?;
    let before = pd.entries();
    fresh(&pd, ifindex, opts, object).inspect_err(|_| pd.remove_new(&before))
}

/// Removes the attachment of `iface`: unpins the link (which detaches the program) and the maps.
pub fn detach(root: &Path, iface: &str) -> Result<(), LoaderError> {
    caps::require(Need::Attach)?;
    pins::check_bpffs(root)?;
    let pd = PinDir::new(root, iface);
    if !pd.is_attached() {
        return Err(PinsError::NotAttached {
            iface: iface.into(),
            root: root.into(),
        }
        .into());
    }
    pd.remove()?;
    Ok(())
}

/// Loads the eBPF object with every map pinned in `pd` (opening the pins that exist, creating the
/// rest, the issued-keys table with `issued_keys` entries). No program is loaded into the kernel
/// or attached yet.
pub fn load_pinned(pd: &PinDir, log_level: u8, issued_keys: u32) -> Result<Ebpf, LoaderError> {
    load_pinned_object(pd, log_level, issued_keys, EBPF_OBJECT)
}

/// [`load_pinned`] from the bytes of another build of the object (one whose maps have the same
/// layout): for benchmarks that run two builds side by side.
pub fn load_pinned_object(
    pd: &PinDir,
    log_level: u8,
    issued_keys: u32,
    object: &[u8],
) -> Result<Ebpf, LoaderError> {
    crate::datapath::pinned_layout::check(pd, object)?;
    load_object(pd, log_level, issued_keys, object, None)
}

/// Loads `object` on the maps pinned in `pd`, those `carry` carries over at their staging pins.
fn load_object(
    pd: &PinDir,
    log_level: u8,
    issued_keys: u32,
    object: &[u8],
    carry: Option<&Carry>,
) -> Result<Ebpf, LoaderError> {
    let metadata = u8::from(xdp_metadata());
    let mut loader = EbpfLoader::new();
    for m in gateway_common::maps::all() {
        loader.map_pin_path(m.name, pd.map(m.name));
    }
    for (name, staging) in carry.into_iter().flat_map(Carry::staging_pins) {
        loader.map_pin_path(name, staging);
    }
    loader.map_max_entries(names::TLS_ISSUED, issued_keys);
    loader.override_global("AYA_LOG_LEVEL", &log_level, false);
    loader.override_global("XDP_METADATA", &metadata, false);
    let object = crate::datapath::kfunc::resolve(object)?;
    Ok(loader.load(&object)?)
}

/// Whether this kernel lets XDP programs grow a frame's metadata, probed once
/// ([`crate::datapath::bpfsys::xdp_metadata_allowed`]). A probe that could not run says yes: loading the
/// programs then reports what the kernel refuses.
pub fn xdp_metadata() -> bool {
    static ALLOWED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ALLOWED.get_or_init(|| match crate::datapath::bpfsys::xdp_metadata_allowed() {
        Ok(allowed) => allowed,
        Err(e) => {
            tracing::debug!("could not probe bpf_xdp_adjust_meta for XDP programs: {e}");
            true
        }
    })
}

/// An attachment's sweep program (`programs::SWEEP`), loaded against its pinned maps and
/// attached nowhere: [`Sweeper::sweep`] runs it once, ending the units whose deadline passed
/// now rather than at the datapath's next admission.
pub struct Sweeper {
    ebpf: Ebpf,
}

impl Sweeper {
    /// Loads the sweep program against the maps pinned in `pd`.
    pub fn load(pd: &PinDir) -> Result<Self, LoaderError> {
        // The maps exist (pinned by the attachment): their sizes are theirs.
        let mut ebpf = load_pinned(pd, 0, gateway_common::maps::DEFAULT_TLS_ISSUED)?;
        let prog: &mut Xdp = ebpf
            .program_mut(programs::SWEEP)
            .expect("object has the sweep program")
            .try_into()
            .map_err(program_err("sweep program"))?;
        prog.load()
            .map_err(program_err("loading the sweep program"))?;
        Ok(Sweeper { ebpf })
    }

    /// Runs the sweep once (`BPF_PROG_TEST_RUN` on a dummy frame).
    pub fn sweep(&self) -> Result<(), LoaderError> {
        let prog: &Xdp = self
            .ebpf
            .program(programs::SWEEP)
            .expect("loaded in Sweeper::load")
            .try_into()
            .map_err(program_err("sweep program"))?;
        let frame = [0u8; 64];
        prog.test_run(TestRunOptions {
            data_in: Some(&frame),
            repeat: 1,
            ..Default::default()
        })
        .map_err(program_err("running the sweep program"))?;
        Ok(())
    }
}

fn xdp(ebpf: &mut Ebpf) -> Result<&mut Xdp, LoaderError> {
    let prog: &mut Xdp = ebpf
        .program_mut(programs::XDP)
        .expect("object has the XDP program")
        .try_into()
        .map_err(program_err("XDP program"))?;
    prog.load()
        .map_err(program_err("loading the XDP program"))?;
    Ok(prog)
}

fn tc(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, LoaderError> {
    classifier(ebpf, programs::TC_INGRESS)
}

fn classifier<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier, LoaderError> {
    let prog: &mut SchedClassifier = ebpf
        .program_mut(name)
        .expect("object has the TC programs")
        .try_into()
        .map_err(program_err(format!("TC program {name}")))?;
    prog.load()
        .map_err(program_err(format!("loading the TC program {name}")))?;
    Ok(prog)
}

/// Loads the programs the ingress programs tail call and puts each in its slot of its hook's
/// jump table (`programs::Jump::program`, `Hook::jump_table`): the SIP classifiers and the reply
/// programs. Done before anything is attached, so the first SIP packet already finds its
/// program; on a replacement the pinned tables get the new programs in place.
pub fn wire_tail_calls(ebpf: &mut Ebpf) -> Result<(), LoaderError> {
    use aya::maps::ProgramArray;
    for hook in Hook::ALL {
        for jump in Jump::ALL {
            let name = jump.program(hook);
            let fd = match hook {
                Hook::Xdp => load_xdp(ebpf, name)?,
                Hook::Tc => classifier(ebpf, name)?
                    .fd()
                    .and_then(|fd| fd.try_clone().map_err(Into::into))
                    .map_err(program_err(format!("TC program {name}'s fd")))?,
            };
            let map = hook.jump_table();
            let mut table: ProgramArray<_> = ebpf
                .map_mut(map)
                .expect("object has the jump tables")
                .try_into()
                .map_err(|e| LoaderError::Maps(MapsError::Op { map, source: e }))?;
            table
                .set(jump.slot(), &fd, 0)
                .map_err(|e| LoaderError::Maps(MapsError::Op { map, source: e }))?;
        }
    }
    Ok(())
}

/// Loads the XDP program `name` of the object; returns its fd.
fn load_xdp(ebpf: &mut Ebpf, name: &str) -> Result<aya::programs::ProgramFd, LoaderError> {
    let what = format!("XDP program {name}");
    let prog: &mut Xdp = ebpf
        .program_mut(name)
        .unwrap_or_else(|| panic!("object has the {what}"))
        .try_into()
        .map_err(program_err(what.clone()))?;
    prog.load().map_err(program_err(what.clone()))?;
    prog.fd()
        .and_then(|fd| fd.try_clone().map_err(Into::into))
        .map_err(program_err(what))
}

/// Attaches the egress program (SIP completions) as a tcx egress link pinned in `pd`, or, when
/// one is pinned already, replaces its program through it.
fn attach_egress(ebpf: &mut Ebpf, pd: &PinDir, iface: &str) -> Result<(), LoaderError> {
    attach_tcx(
        ebpf,
        programs::TC_EGRESS,
        TcAttachType::Egress,
        &pd.egress_link(),
        iface,
    )
}

/// Attaches an XDP attachment's finishing program at tcx ingress (pinned in `pd`, or replaced
/// through its pinned link), then tells the datapath it may hand refused connections over to it
/// (`DatapathConfig::finisher`, once the key of the frames' tags is drawn), and, in native mode
/// on a device whose XDP_TX may not deliver (a veth), its replies too.
fn attach_finisher(
    ebpf: &mut Ebpf,
    pd: &PinDir,
    iface: &str,
    mode: AttachMode,
) -> Result<(), LoaderError> {
    attach_tcx(
        ebpf,
        programs::TC_FINISH,
        TcAttachType::Ingress,
        &pd.finish_link(),
        iface,
    )?;
    let mut finisher = FINISHER_ATTACHED;
    if mode == AttachMode::Native && ethtool::xdp_tx_may_vanish(iface) {
        finisher |= FINISHER_SENDS_REPLIES;
    }
    // The tags' key first: drawn once per attachment, kept through restarts and upgrades (the
    // XDP program of the moment and the finishing program must agree on it).
    maps::ensure_handover_key(pd)?;
    maps::change_config(pd, |cfg| cfg.finisher = finisher)?;
    Ok(())
}

/// Attaches the TC program `name` as a tcx link of `attach_type` on `iface`, pinned at `pin`;
/// when a link is pinned there already, replaces its program through it.
fn attach_tcx(
    ebpf: &mut Ebpf,
    name: &str,
    attach_type: TcAttachType,
    pin: &Path,
    iface: &str,
) -> Result<(), LoaderError> {
    let prog = classifier(ebpf, name)?;
    let what = format!("attaching {name} to {iface}");
    if pin.exists() {
        let link: FdLink = PinnedLink::from_pin(pin)?.into();
        let id = prog
            .attach_to_link(SchedClassifierLink::try_from(link)?)
            .map_err(program_err(what.clone()))?;
        drop(prog.take_link(id).map_err(program_err(what))?);
        return Ok(());
    }
    let id = prog
        .attach_with_options(
            iface,
            attach_type,
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        )
        .map_err(program_err(what.clone()))?;
    let link: FdLink = prog
        .take_link(id)
        .map_err(program_err(what))?
        .try_into()
        .map_err(LoaderError::Link)?;
    let _pinned = link.pin(pin)?;
    Ok(())
}

/// The hook `opts` asks for as this kernel can give it: auto takes tc ingress where the kernel
/// refuses XDP programs frame metadata (with the reason, reported), and an explicit XDP mode is
/// refused there.
fn hook_for(opts: &AttachOptions) -> Result<(ModeRequest, Option<String>), LoaderError> {
    match opts.mode {
        ModeRequest::Auto if !xdp_metadata() => Ok((
            ModeRequest::Tc,
            Some(
                "this kernel refuses XDP programs bpf_xdp_adjust_meta, by which XDP hands frames \
                 to its TC finishing program"
                    .to_owned(),
            ),
        )),
        ModeRequest::Native | ModeRequest::Generic if !xdp_metadata() => {
            Err(LoaderError::NoXdpMetadata {
                iface: opts.iface.clone(),
                requested: opts.mode.exact().map_or("", AttachMode::name),
            })
        }
        request => Ok((request, None)),
    }
}

fn fresh(
    pd: &PinDir,
    ifindex: u32,
    opts: &AttachOptions,
    object: &[u8],
) -> Result<AttachOutcome, LoaderError> {
    let (request, fallback) = hook_for(opts)?;
    let mut ebpf = load_pinned_object(pd, opts.ebpf_log_level, opts.issued_keys, object)?;
    // Maps an older build pinned without a program on them: nothing changes them meanwhile.
    let moving = Moving::begin(pd)?;
    wire_tail_calls(&mut ebpf)?;
    record_layouts(pd, &ebpf, object)?;
    let iface = &opts.iface;
    let mut fallback_reason = fallback;
    let (mode, link): (AttachMode, FdLink) = match request {
        ModeRequest::Tc => {
            let prog = tc(&mut ebpf)?;
            let what = format!("attaching tc ingress to {iface}");
            let id = prog
                .attach_with_options(
                    iface,
                    TcAttachType::Ingress,
                    TcAttachOptions::TcxOrder(LinkOrder::default()),
                )
                .map_err(program_err(what.clone()))?;
            let link = prog.take_link(id).map_err(program_err(what.clone()))?;
            (AttachMode::Tc, link.try_into().map_err(LoaderError::Link)?)
        }
        request => {
            let prog = xdp(&mut ebpf)?;
            let (mode, id) = match request {
                ModeRequest::Generic => (
                    AttachMode::Generic,
                    prog.attach_to_if_index(ifindex, XdpMode::Skb)
                        .map_err(program_err(format!("attaching generic XDP to {iface}")))?,
                ),
                ModeRequest::Auto => match prog.attach_to_if_index(ifindex, XdpMode::Driver) {
                    Ok(id) => (AttachMode::Native, id),
                    Err(native) => {
                        fallback_reason = Some(native.to_string());
                        (
                            AttachMode::Generic,
                            prog.attach_to_if_index(ifindex, XdpMode::Skb)
                                .map_err(program_err(format!(
                                    "attaching generic XDP to {iface} (native failed: {native})"
                                )))?,
                        )
                    }
                },
                _ => (
                    AttachMode::Native,
                    prog.attach_to_if_index(ifindex, XdpMode::Driver)
                        .map_err(program_err(format!(
                            "attaching native XDP to {iface} (use --mode auto to fall back to generic)"
                        )))?,
                ),
            };
            let link = prog
                .take_link(id)
                .map_err(program_err("taking the XDP link"))?;
            (mode, link.try_into().map_err(LoaderError::Link)?)
        }
    };
    let info = link.info()?;
    // From here the pin holds the link; our fd closes when `link` goes out of scope.
    let _pinned = link.pin(pd.link())?;
    attach_egress(&mut ebpf, pd, iface)?;
    record_mode(pd, mode, ifindex)?;
    if mode != AttachMode::Tc {
        attach_finisher(&mut ebpf, pd, iface, mode)?;
    }
    // Again, now that every program is loaded and attached: the next start asks which maps
    // the linked ones use.
    record_layouts(pd, &ebpf, object)?;
    let moved = moving.finish()?;
    Ok(AttachOutcome {
        iface: iface.clone(),
        mode,
        link_id: info.id(),
        program_id: info.program_id(),
        replaced: false,
        fallback_reason,
        carried: Vec::new(),
        finished: Vec::new(),
        moved,
        ebpf,
    })
}

/// Replaces the programs of the attachment pinned in `pd` with this build's, through their
/// links. A map whose value this build lays out otherwise is carried over (`crate::datapath::carry`):
/// this build's copy is made and filled beside it before the programs are replaced, and takes
/// its pin once the older programs' last runs ended.
fn replace(pd: &PinDir, opts: &AttachOptions) -> Result<AttachOutcome, LoaderError> {
    let recorded = AttachMode::from_id(maps::read_config(pd)?.attach_mode);
    if recorded != AttachMode::Tc && !xdp_metadata() {
        return Err(LoaderError::NoXdpMetadata {
            iface: opts.iface.clone(),
            requested: recorded.name(),
        });
    }
    if let Some(requested) = opts.mode.exact()
        && requested != recorded
    {
        return Err(LoaderError::ModeMismatch {
            iface: opts.iface.clone(),
            attached: recorded.name(),
            requested: requested.name(),
        });
    }
    let link: FdLink = PinnedLink::from_pin(pd.link())?.into();
    let finished = carry::recover(pd)?;
    let mut carry = Carry::begin(pd, crate::datapath::pinned_layout::grown(pd, EBPF_OBJECT)?)?;
    let mut ebpf = load_object(
        pd,
        opts.ebpf_log_level,
        opts.issued_keys,
        EBPF_OBJECT,
        Some(&carry),
    )?;
    carry.copy()?;
    let moving = Moving::begin(pd)?;
    wire_tail_calls(&mut ebpf)?;
    record_layouts(pd, &ebpf, EBPF_OBJECT)?;
    let what = format!("replacing the program on {} through its link", opts.iface);
    match recorded {
        AttachMode::Tc => {
            let prog = tc(&mut ebpf)?;
            let id = prog
                .attach_to_link(SchedClassifierLink::try_from(link)?)
                .map_err(program_err(what.clone()))?;
            drop(prog.take_link(id).map_err(program_err(what))?);
        }
        _ => {
            let prog = xdp(&mut ebpf)?;
            let id = prog
                .attach_to_link(XdpLink::try_from(link)?)
                .map_err(program_err(what.clone()))?;
            drop(prog.take_link(id).map_err(program_err(what))?);
        }
    }
    attach_egress(&mut ebpf, pd, &opts.iface)?;
    if recorded != AttachMode::Tc {
        attach_finisher(&mut ebpf, pd, &opts.iface, recorded)?;
    }
    record_layouts(pd, &ebpf, EBPF_OBJECT)?;
    let carried = carry.finish()?;
    let moved = moving.finish()?;
    let info = FdLink::from(PinnedLink::from_pin(pd.link())?).info()?;
    Ok(AttachOutcome {
        iface: opts.iface.clone(),
        mode: recorded,
        link_id: info.id(),
        program_id: info.program_id(),
        replaced: true,
        fallback_reason: None,
        carried,
        finished,
        moved,
        ebpf,
    })
}

/// Records the BTF of `object`, whose programs `ebpf` loaded, and the maps each of them uses,
/// beside the maps pinned in `pd` (`crate::datapath::layouts`), before anything is attached: the maps it
/// made or carries over use that BTF, and the next start asks which maps its programs use.
fn record_layouts(pd: &PinDir, ebpf: &Ebpf, object: &[u8]) -> Result<(), LoaderError> {
    let unreadable = |what: String| {
        LoaderError::Layouts(LayoutsError::Io {
            path: pd.dir.join(layouts::PIN),
            what: "reading the programs loaded",
            source: std::io::Error::other(what),
        })
    };
    let mut load = layouts::Loaded {
        object,
        btf_id: 0,
        programs: Vec::new(),
    };
    for (name, p) in ebpf.programs() {
        // Only the programs this start loaded (the rest of the object stays unloaded).
        let Ok(fd) = p.fd() else { continue };
        let info = p.info().map_err(|e| unreadable(format!("{name}: {e}")))?;
        let fd = std::os::fd::AsFd::as_fd(fd)
            .try_clone_to_owned()
            .map_err(|e| unreadable(format!("{name}: {e}")))?;
        let maps = crate::datapath::bpfsys::program_fd_maps(&fd)
            .map_err(|e| unreadable(format!("{name}: {e}")))?;
        load.btf_id = load.btf_id.max(info.btf_id().unwrap_or(0));
        load.programs.push((info.id(), maps));
    }
    if load.btf_id == 0 {
        return Err(unreadable("no loaded program has BTF".into()));
    }
    let attached = carry::attached_programs(pd).map_err(|e| unreadable(e.to_string()))?;
    layouts::write(&pd.dir, &load, &attached)?;
    Ok(())
}

fn record_mode(pd: &PinDir, mode: AttachMode, ifindex: u32) -> Result<(), LoaderError> {
    maps::change_config(pd, |cfg| {
        cfg.attach_mode = mode as u32;
        cfg.ifindex = ifindex;
    })?;
    Ok(())
}

/// Facts about an existing attachment, read from its pins.
#[derive(Debug, Serialize)]
pub struct AttachmentStatus {
    /// Interface name.
    pub iface: String,
    /// Hook in use.
    pub mode: &'static str,
    /// Interface index recorded at attach.
    pub ifindex: u32,
    /// Kernel id of the link.
    pub link_id: u32,
    /// Kernel id of the running program.
    pub program_id: u32,
    /// Kernel id of the tcx egress link.
    pub egress_link_id: Option<u32>,
    /// Kernel id of the finishing program's tcx ingress link (XDP attachments).
    pub finish_link_id: Option<u32>,
    /// The `gateway run` daemon serving the attachment, if one runs (it holds the datapath's
    /// lock, `PinDir::holder`).
    pub daemon_pid: Option<u32>,
    /// A daemon recorded as serving the attachment that no longer runs: it ended without its
    /// exit path (killed), leaving its policy in the maps and nothing to move it.
    pub daemon_gone: Option<u32>,
    /// Instructions the verifier processed to accept the program (its limit is 1,000,000): the
    /// margin left for the datapath to grow.
    pub verified_insns: Option<u32>,
    /// Pin directory.
    pub pin_dir: String,
}

/// The kernel id of the link pinned at `path`, if one is.
fn pinned_link_id(path: &std::path::Path) -> Option<u32> {
    PinnedLink::from_pin(path)
        .ok()
        .and_then(|l| FdLink::from(l).info().ok())
        .map(|i| i.id())
}

/// Reads the facts of the attachment pinned in `pd`.
pub fn info(pd: &PinDir) -> Result<AttachmentStatus, LoaderError> {
    let cfg = maps::read_config(pd)?;
    let info = FdLink::from(PinnedLink::from_pin(pd.link())?).info()?;
    let holder = pd.holder();
    Ok(AttachmentStatus {
        iface: pd.iface.clone(),
        mode: AttachMode::from_id(cfg.attach_mode).name(),
        ifindex: cfg.ifindex,
        link_id: info.id(),
        program_id: info.program_id(),
        egress_link_id: pinned_link_id(&pd.egress_link()),
        finish_link_id: pinned_link_id(&pd.finish_link()),
        daemon_pid: (cfg.daemon_pid != 0 && holder == Some(cfg.daemon_pid))
            .then_some(cfg.daemon_pid),
        daemon_gone: (cfg.daemon_pid != 0 && holder != Some(cfg.daemon_pid))
            .then_some(cfg.daemon_pid),
        verified_insns: aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .find(|p| p.id() == info.program_id())
            .and_then(|p| p.verified_instruction_count()),
        pin_dir: pd.dir.display().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_says_its_causes_once_each() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`bpf_link_create` failed")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::from_raw_os_error(libc::EBUSY));
        assert_eq!(
            with_causes(&e),
            "`bpf_link_create` failed: Device or resource busy (os error 16)"
        );
        let plain = std::io::Error::other("alone");
        assert_eq!(with_causes(&plain), "alone");
    }
}
