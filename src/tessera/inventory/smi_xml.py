"""``nvidia-smi -q -x`` (``<nvidia_smi_log>``, DTD versions v10..v13)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ._records import RawGPU, RawMig, build_gpus, mig_problem, parse_mib
from .errors import MalformedInputError, UnsupportedFormatError
from .model import GPU, small_int


def _text(el: ET.Element | None, path: str) -> str | None:
    if el is None:
        return None
    found = el.find(path)
    if found is None or found.text is None:
        return None
    return found.text.strip()


def _int(text: str | None) -> int | None:
    return small_int(text)


def parse_smi_xml(text: str, source: str, warnings: list[str] | None = None) -> list[GPU]:
    """Parse ``nvidia-smi -q -x`` output.

    Reads per ``<gpu>``: ``product_name``, ``product_architecture``, ``uuid``, ``pci/pci_bus_id``
    (or the ``id`` attribute), ``fb_memory_usage/total``, ``mig_mode/current_mig`` and each
    ``mig_devices/mig_device`` (``index``, ``gpu_instance_id``, ``compute_instance_id``,
    ``device_attributes/shared/multiprocessor_count``, ``fb_memory_usage/total``); and
    ``driver_version``, ``cuda_version`` from the root. GPU index = order of ``<gpu>`` elements
    (nvidia-smi's index order), not ``minor_number``.

    A ``<attached_gpus>`` count that differs from the ``<gpu>`` elements listed is appended to
    ``warnings`` (the listed GPUs are read).

    Raises :class:`MalformedInputError` (with line and column) for malformed or truncated XML,
    :class:`UnsupportedFormatError` for XML that is not an ``nvidia_smi_log``.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        line, column = err.position
        reason = str(err).split(":", 1)[0]
        raise MalformedInputError(
            f"nvidia-smi XML is malformed or truncated ({reason}); capture it again, complete, "
            "with `nvidia-smi -q -x > FILE`",
            source=source,
            field="xml",
            line=line,
            column=column + 1,
        ) from None
    if root.tag != "nvidia_smi_log":
        raise UnsupportedFormatError(
            f"XML root element is <{root.tag}>, not <nvidia_smi_log>; give `nvidia-smi -q -x` output",
            source=source,
            field="xml",
        )
    driver = _text(root, "driver_version")
    cuda = _text(root, "cuda_version")
    raws: list[RawGPU] = []
    for index, gpu in enumerate(root.findall("gpu")):
        migs: list[RawMig] = []
        for k, mig in enumerate(gpu.findall("mig_devices/mig_device")):
            mem = _text(mig, "fb_memory_usage/total") or _text(mig, "shared_fb_memory_usage/total")
            mib = parse_mib(mem)
            gi = _int(_text(mig, "gpu_instance_id"))
            ci = _int(_text(mig, "compute_instance_id"))
            if mib is None or gi is None or ci is None:
                raise MalformedInputError(
                    mig_problem(
                        index,
                        k,
                        {
                            "gpu_instance_id": _text(mig, "gpu_instance_id"),
                            "compute_instance_id": _text(mig, "compute_instance_id"),
                            "fb_memory_usage/total": mem,
                        },
                    ),
                    source=source,
                    field="mig_device",
                )
            idx = _int(_text(mig, "index"))
            migs.append(
                RawMig(
                    index=idx if idx is not None else k,
                    gpu_instance_id=gi,
                    compute_instance_id=ci,
                    memory_mib=mib,
                    sm_count=_int(_text(mig, "device_attributes/shared/multiprocessor_count")),
                )
            )
        raws.append(
            RawGPU(
                index=index,
                uuid=_text(gpu, "uuid"),
                product_name=_text(gpu, "product_name"),
                memory=_text(gpu, "fb_memory_usage/total"),
                memory_reserved=_text(gpu, "fb_memory_usage/reserved"),
                architecture=_text(gpu, "product_architecture"),
                driver_version=driver,
                cuda_version=cuda,
                bus_id=_text(gpu, "pci/pci_bus_id") or gpu.get("id"),
                mig_enabled=(_text(gpu, "mig_mode/current_mig") or "").lower() == "enabled",
                migs=migs,
            )
        )
    if not raws:
        raise UnsupportedFormatError(
            "nvidia_smi_log lists no <gpu>; the node has no visible NVIDIA GPU",
            source=source,
            field="gpu",
        )
    attached = _text(root, "attached_gpus")
    if attached is not None and small_int(attached) != len(raws) and warnings is not None:
        warnings.append(
            f"{source}: attached_gpus: says {attached} but {len(raws)} <gpu> element(s) follow; "
            f"reading the {len(raws)} listed (a capture cut or edited? capture `nvidia-smi -q -x` again "
            "to see every GPU)"
        )
    return build_gpus(raws, source)
