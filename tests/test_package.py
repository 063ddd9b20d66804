"""The package namespace: what ``dir(pymc_pnode)`` lists is the public API, and every listed name resolves."""

import pymc_pnode as pn


def test_dir_lists_the_public_api_and_every_name_resolves():
    names = dir(pn)
    assert set(pn.__all__) <= set(names)
    assert not {"annotations", "importlib", "tune_allocator"} & set(names)  # the module's own imports
    for name in names:
        assert getattr(pn, name) is not None, name
