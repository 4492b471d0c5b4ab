"""The model families, a package each with one declared face (face.py): registry.py finds a family by
its HF architecture or its manifest name, adapters.py its components' runtime adapters by name.
Torch-free here and in each family's face and host.py; the torch modules are the build's."""
