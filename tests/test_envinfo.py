"""``env.json``'s library versions come from the registry (``Pipeline.libraries``), not from a list in
``bench.envinfo``: a new adapter's decoder reaches env.json and the code identity by registering."""

from __future__ import annotations

import pipelines.base as base
from bench import envinfo
from pipelines.raw import RawPipeline


class WithCodec(RawPipeline):
    @classmethod
    def libraries(cls) -> dict[str, str | None]:
        return {"libtestcodec": "9.8.7", "torchvision": envinfo._version("torchvision")}


def test_a_registered_adapter_s_libraries_reach_env_json_and_the_code_identity(monkeypatch):
    before = envinfo.code_identity()
    monkeypatch.setitem(base._REGISTRY, "test-codec", WithCodec)
    assert envinfo.pipeline_libraries()["test-codec"] == WithCodec.libraries()
    versions = envinfo.library_versions()
    assert versions["libtestcodec"] == "9.8.7" and versions["torchvision"] == envinfo._version("torchvision")
    after = envinfo.code_identity()
    assert after["libraries"]["libtestcodec"] == "9.8.7" and after["id"] != before["id"]
    env = envinfo.collect()
    assert env["pipelines"]["test-codec"] == {"libtestcodec": "9.8.7", "torchvision": envinfo._version("torchvision")}
    # kept for readers of older runs: the fixed versions list and torch-nvjpeg's decoder
    assert {"torch", "torchvision", "torchcodec", "nvidia-dali"} <= set(env["versions"]) and "torch_nvjpeg" in env


def test_the_built_ins_keep_the_code_identity_s_library_list():
    """The built-ins name torchvision, TorchCodec, DALI and PIL: the identity's libraries are the ones
    it had before they came from the registry (a sweep's finished cells do not go stale for it)."""
    assert set(envinfo.library_versions()) == {"torch", "torchvision", "torchcodec", "nvidia-dali", "PIL"}


def test_two_adapters_naming_one_library_differently_are_both_recorded(monkeypatch):
    class Other(RawPipeline):
        @classmethod
        def libraries(cls) -> dict[str, str | None]:
            return {"libtestcodec": "1.0"}

    monkeypatch.setitem(base._REGISTRY, "test-codec", WithCodec)
    monkeypatch.setitem(base._REGISTRY, "test-codec-2", Other)
    assert envinfo.library_versions()["libtestcodec"] == "1.0 | 9.8.7"
